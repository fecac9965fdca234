"""Full-text search over saved messages (SQLite FTS5, schema 2), and the migration of a database
that today's released chatcli (schema 1) wrote: tests/data/chatcli-v1.db."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

from chatcli.chat.conversation import Conversation
from chatcli.chat.schema import SCHEMA_VERSION
from chatcli.chat.store import Store

V1 = Path(__file__).parent / "data" / "chatcli-v1.db"


def test_a_schema_1_database_is_migrated_and_indexed(tmp_path):
    path = tmp_path / "chatcli.db"
    shutil.copy(V1, path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 1
    store = Store(path)
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    assert [s.messages for s in store.summaries()] == [4, 2]  # nothing lost
    france = store.load("6bbcc0beb54c")
    assert [m.content for m in france.messages][1] == "The capital of France is Paris."
    hits = store.search("paris")
    assert [(h.conversation_id, h.index, h.role) for h in hits] == [("6bbcc0beb54c", 1, "assistant")]
    assert "[Paris]" in hits[0].snippet and hits[0].title == "What is the capital of France?"
    assert [h.index for h in store.search("cafe")] == [2]  # accents folded
    store.close()
    assert Store(path).db.execute("PRAGMA user_version").fetchone()[0] == 5  # migrated once


def saved(store: Store, *texts: str) -> Conversation:
    conv = Conversation()
    for i, text in enumerate(texts):
        if i % 2 == 0:
            conv.add_user(text)
        else:
            conv.add_reply(text, "stop")
    store.create(conv, "m")
    return conv


def test_ranked_by_bm25_every_word_and_kept_up_to_date(tmp_path):
    store = Store(tmp_path / "db")
    once = saved(store, "please show me a list, reversed, in python code today", "tell me about sorting")
    many = saved(store, "list list list comprehension", "a list of lists")
    hits = store.search("list")
    assert [h.conversation_id for h in hits][:2] == [many.id, many.id] and hits[-1].conversation_id == once.id
    assert [h.rank for h in hits] == sorted(h.rank for h in hits)
    assert [h.conversation_id for h in store.search("list reversed")] == [once.id]  # every word
    store.add_message(once.id, once.add_user("now about quicksort"))
    assert [h.index for h in store.search("quicksort")] == [2]
    store.remove_last(once.id, 1)  # /undo
    assert store.search("quicksort") == []
    store.delete(many.id)
    assert {h.conversation_id for h in store.search("list")} == {once.id}


def test_search_text_is_words_not_syntax(tmp_path):
    store = Store(tmp_path / "db")
    saved(store, 'he said "hi" OR (maybe) NEAR* -x', "ok")
    assert len(store.search('"hi" OR (maybe')) == 1
    assert store.search("   ") == [] and store.search("absent") == []


def run_history(tmp_path, *args):
    import os
    import subprocess
    import sys

    env = {**os.environ, "CHATCLI_DATA_DIR": str(tmp_path), "CHATCLI_CONFIG": str(tmp_path / "none.toml")}
    cmd = [sys.executable, "-m", "chatcli", "history", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def test_history_search_on_the_command_line(tmp_path):
    import json

    shutil.copy(V1, tmp_path / "chatcli.db")  # today's history, migrated on first open
    proc = run_history(tmp_path, "--search", "capital italy")
    assert proc.returncode == 0, proc.stderr
    head, snippet = proc.stdout.splitlines()[:2]
    assert head.startswith("6bbcc0beb54c  #4 assistant") and "[capital] of [Italy]" in snippet
    hits = json.loads(run_history(tmp_path, "--search", "capital", "--json").stdout)
    assert len(hits) == 3 and [h["rank"] for h in hits] == sorted(h["rank"] for h in hits)  # best first
    assert {h["conversation_id"] for h in hits} == {"6bbcc0beb54c"}
    none = run_history(tmp_path, "--search", "zebra")  # an answer, not an error
    assert (none.returncode, none.stdout, none.stderr) == (0, "no saved message holds 'zebra'\n", "")
    none = run_history(tmp_path, "--search", "zebra", "--json")
    assert (none.returncode, json.loads(none.stdout), none.stderr) == (0, [], "")


def test_branches_are_stored_with_their_parent_and_listed_as_a_tree(tmp_path):
    path = tmp_path / "chatcli.db"
    shutil.copy(V1, path)
    store = Store(path)  # migrated: the old conversations are roots
    old = store.load("6bbcc0beb54c")
    assert (old.parent_id, old.fork_at) == (None, None)
    assert store.family(old.id) == [(old.id, None, None)]
    branch = old.branch(2)
    branch.add_user("And of Spain?")
    store.create(branch, "m")
    twig = branch.branch(3)
    twig.add_reply("Madrid.", "stop")
    store.create(twig, "m")
    for conv_id in (old.id, branch.id, twig.id):  # the same tree from any of its branches
        assert store.family(conv_id) == [(old.id, None, None), (branch.id, old.id, 2), (twig.id, branch.id, 3)]
    loaded = store.load(branch.id)
    assert [m.content for m in loaded.messages] == [m.content for m in old.messages[:2]] + ["And of Spain?"]
    assert {s.id: s.parent_id for s in store.summaries()}[twig.id] == branch.id


def test_a_schema_2_database_gets_the_branch_columns(tmp_path):
    """Schema 2 (the index, before branches) existed in this project's history: it upgrades to 3, 4, then 5."""
    from chatcli.chat.schema import SCHEMA_V1, SCHEMA_V2

    path = tmp_path / "chatcli.db"
    db = sqlite3.connect(path)
    db.executescript(f"{SCHEMA_V1} {SCHEMA_V2} PRAGMA user_version=2;")
    db.execute("INSERT INTO conversations (id, title, model, created, updated) VALUES ('a', 't', 'm', 0, 0)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES ('a', 'user', 'hola', 0)")
    db.commit()
    db.close()
    store = Store(path)
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == 5
    assert (
        store.load("a").parent_id is None
        and store.load("a").imported_from is None
        and [h.conversation_id for h in store.search("hola")] == ["a"]
    )


def test_a_message_copied_by_a_branch_and_an_import_is_one_hit_naming_them(tmp_path):
    store = Store(tmp_path / "db")
    root = saved(store, "how to cook pasta", "Boil the spaghetti for nine minutes.", "and tea?", "Steep it.")
    branch = root.branch(2)  # /edit 3: the first exchange shared
    branch.add_user("and coffee?")
    store.create(branch, "m")
    store.rename(branch.id, "coffee")
    imported = store.import_export(store.export(root.id))  # /load of its JSON export
    assert store.load(imported.id).imported_from == root.id
    saved(store, "a spaghetti western", "The Good, the Bad and the Ugly.")  # another message, its own hit

    hits = store.search("spaghetti nine")
    assert len(hits) == 1  # one message, three conversations hold it
    hit = hits[0]
    assert (hit.conversation_id, hit.index, hit.role) == (root.id, 1, "assistant")  # the original
    assert [(c.conversation_id, c.kind, c.index) for c in hit.copies] == [
        (branch.id, "branch", 1),
        (imported.id, "import", 1),
    ]
    assert hit.also_in() == "also in: ⑂ branch 'coffee' #2, import 'how to cook pasta' #2"
    assert sorted(len(h.copies) for h in store.search("spaghetti")) == [0, 2]  # the western: a hit of its own
    assert [len(h.copies) for h in store.search("coffee")] == [0]  # the branch's own message: no copies
    assert hit.to_dict()["copies"][0] == {"conversation_id": branch.id, "title": "coffee", "index": 1, "kind": "branch"}


def test_history_search_folds_the_copies(tmp_path):
    store = Store(tmp_path / "chatcli.db")
    root = saved(store, "how to cook pasta", "Boil the spaghetti.")
    store.create(root.branch(2), "m")
    store.close()
    proc = run_history(tmp_path, "--search", "spaghetti")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith(f"{root.id}  #2 assistant")
    assert lines[2] == "    also in: ⑂ branch 'how to cook pasta' #2"
