"""What /copy picks (chat/copying.py): the last reply, its Nth code block, or message N."""

import pytest

from chatcli.chat.conversation import Conversation
from chatcli.chat.copying import CopyError, code_blocks, pick
from chatcli.engine.events import FinishReason

REPLY = """Two ways:

```python
print("one")
```

and

```sh
echo two
```
"""


def conversation() -> Conversation:
    conv = Conversation()
    conv.add_user("How do I print?")
    conv.add_reply(REPLY, FinishReason.STOP)
    return conv


def test_code_blocks_are_markdowns_fences():
    assert code_blocks(REPLY) == ['print("one")\n', "echo two\n"]
    assert code_blocks("no code, just `inline`") == []
    assert code_blocks("    indented\n") == ["indented\n"]


def test_pick_each_target():
    conv = conversation()
    assert pick(conv, "") == (REPLY, "the last reply")
    assert pick(conv, "code") == ('print("one")\n', "code block 1 of the last reply")
    assert pick(conv, "code 2")[0] == "echo two\n"
    assert pick(conv, "1") == ("How do I print?", "message 1 (user)")


@pytest.mark.parametrize(
    "arg,message",
    [
        ("code 3", "has 2 code blocks, not 3"),
        ("code x", "N must be a whole number"),
        ("9", "has 2 messages, not 9"),
        ("0", "N must be a whole number from 1"),
        ("1 2", r"takes nothing, 'code \[N\]' or a message number N"),
    ],
)
def test_bad_arguments_say_why(arg, message):
    with pytest.raises(CopyError, match=message):
        pick(conversation(), arg)
    with pytest.raises(CopyError, match="no reply to copy yet"):
        pick(Conversation(), "")
