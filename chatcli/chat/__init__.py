"""Pure chat logic: the conversation and slash commands. No torch, no Textual."""
