//! Operating-system helpers with no lease logic: the one fd operation that
//! needs `unsafe`, where state and runtime files live, and the systemd
//! notification socket.

#[allow(unsafe_code)]
pub mod fd;
pub mod notify;
pub mod paths;
pub mod signal;
#[allow(unsafe_code)]
pub mod sqlite_at;
