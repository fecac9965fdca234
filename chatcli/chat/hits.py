"""What a search found (`Store.search`): a message once, however many conversations hold it.

A branch shares its parent's first messages and an import (`/load`) copies a whole conversation, so
one message's text can be in several conversations; `fold` makes them one `Hit`, the original
(the oldest conversation that is neither a branch nor an import) with the others as its `copies`,
each named for where it is (`also_in`: `also in: ⑂ branch 'title' #3, import 'title' #3`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Copy:
    """Where else a message's text is: a branch's shared message, an import's, or the same words again."""

    conversation_id: str
    title: str
    index: int
    kind: str  # "branch", "import" or "" (another conversation that holds the same message)

    def named(self) -> str:
        return {"branch": "⑂ branch ", "import": "import "}.get(self.kind, "") + f"{self.title!r} #{self.index + 1}"


@dataclass
class Hit:
    """A message that matched a search: where it is (its conversation, its index there) and a snippet;
    the same message (role and text) elsewhere folded under it as its `copies`."""

    conversation_id: str
    title: str
    index: int  # the message's position in its conversation, from 0
    role: str
    snippet: str  # the text around the match, the words found in [brackets]
    rank: float  # BM25: lower is better
    copies: list[Copy] = field(default_factory=list)

    def also_in(self) -> str:
        """The copies in one line ('' for none): `also in: ⑂ branch 'title' #3, import 'title' #3`."""
        return "also in: " + ", ".join(c.named() for c in self.copies) if self.copies else ""

    def to_dict(self) -> dict:
        return {**self.__dict__, "copies": [dict(c.__dict__) for c in self.copies]}


def fold(found: list[tuple[Hit, str, str]], limit: int) -> list[Hit]:
    """The first `limit` messages of `found` ((hit, its message's text, its conversation's kind), best
    first), each once: the hits of the same role and text folded into the original's `copies`."""
    same: dict[tuple[str, str], list[tuple[Hit, str]]] = {}  # (role, text): its hits and their kinds
    for hit, text, kind in found:
        same.setdefault((hit.role, text), []).append((hit, kind))
    hits = []
    for group in list(same.values())[:limit]:
        group.sort(key=lambda pair: pair[1] != "")  # the original first (stable: the oldest of them)
        (hit, _), *copies = group
        hit.copies = [Copy(c.conversation_id, c.title, c.index, kind) for c, kind in copies]
        hits.append(hit)
    return hits
