//! Fenced writes at the sink: the token check and the write in one transaction (issue #4).
