"""Edit and branch on the chat screen: `/edit N` (F9 for your last) puts one of your messages back in the
prompt; Enter then sends it as a new branch holding the messages before it (`Chats.branch`), the old
conversation kept as it was. A mixin of `ChatScreen`, on its `editing` (the message's index, or None)."""

from __future__ import annotations


class Editing:
    async def action_edit_last(self) -> None:
        await self.run_command("/edit")

    def start_edit(self, number: int | None) -> None:
        """/edit [N]: message #N, one of yours (your last by default), into the prompt; Enter sends it as a branch."""
        users = [i + 1 for i, m in enumerate(self.conversation.messages) if m.role == "user"]
        if not users:
            self.note("/edit: no message of yours to edit yet", error=True)
            return
        if number is not None and number not in users:
            yours = ", ".join(f"#{n}" for n in users[-8:])
            self.note(f"/edit: #{number} is not one of your messages here ({yours})", error=True)
            return
        if self.refuse_switch():
            return
        number = number or users[-1]
        self.editing = number - 1
        self.prompt.restore(self.conversation.messages[self.editing].content)
        self.prompt.focus()
        self.note(
            f"Editing message #{number}: Enter sends it as a new branch from there "
            "(this one stays: /branches, F3); Esc cancels."
        )

    async def _branch_for_edit(self) -> bool:
        """The edit is sent: a branch with the messages before the edited one becomes the conversation."""
        if self.refuse_switch():
            return False
        at, self.editing = self.editing, None
        old = self.conversation
        branch = self.chats.branch(old, at)
        await self.show_conversation(branch)
        self.note(f"Branched from “{old.title}” at message {at + 1}; /branches lists its branches.")
        return True
