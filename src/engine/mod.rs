//! The lease engine on SQLite, shared by `serve` and the embedded default (issue #3).
