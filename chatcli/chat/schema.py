"""The conversation database's schema, one version at a time: what `store.Store` creates in a new
file and the statements that bring an earlier chatcli's file up to date (`PRAGMA user_version`)."""

SCHEMA_VERSION = 5

SCHEMA_V1 = """
CREATE TABLE conversations (
    id TEXT PRIMARY KEY,
    title TEXT,              -- set by /rename; NULL: taken from the first user message
    model TEXT NOT NULL DEFAULT '',
    system TEXT,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    finish_reason TEXT,
    stats TEXT,              -- JSON: TurnStats of a reply
    sampling TEXT,           -- JSON: the SamplingParams a reply was made with
    created REAL NOT NULL
);
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
CREATE INDEX conversations_by_updated ON conversations(updated);
"""


# 2: full-text search over the messages (an external-content FTS5 index, kept by triggers)
SCHEMA_V2 = """
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
END;
INSERT INTO messages_fts(messages_fts) VALUES ('rebuild');
"""

# 3: branches (/edit): the conversation a branch came from and how many messages it shares with it
SCHEMA_V3 = """
ALTER TABLE conversations ADD COLUMN parent_id TEXT;
ALTER TABLE conversations ADD COLUMN fork_at INTEGER;
"""
# 4: tool calls (MCP): an assistant message's calls, a tool result's call (JSON; see conversation.Message)
SCHEMA_V4 = """
ALTER TABLE messages ADD COLUMN tools TEXT;
"""
# 5: imports (/load, a JSON export): the id of the conversation the file was exported from ('' if none)
SCHEMA_V5 = """
ALTER TABLE conversations ADD COLUMN imported_from TEXT;
"""
UPGRADES = {1: SCHEMA_V2, 2: SCHEMA_V3, 3: SCHEMA_V4, 4: SCHEMA_V5}  # from version N to N + 1
