"""The one base class of the failures a user can fix, and the config error every layer raises.

Each concept keeps its own error next to its code (DataError in data/text.py, CheckpointError in
train/checkpoint.py, ...), and every one of them is a `UserError`: its message names the file,
the line or the key, and the fix. Every entry point turns a UserError into one line,
`error: <Type>: <message>`, on stderr and exit status 1 (seq2seq/cli/app.py); anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure whose message says what to fix (bad input, config, file or state)."""


class ConfigError(UserError, ValueError):
    """A config value out of its valid range; the message names the key and the range."""
