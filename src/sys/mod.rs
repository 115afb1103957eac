//! Operating-system helpers with no lease logic: the one fd operation that
//! needs `unsafe`, where state and runtime files live, and the systemd
//! notification socket.

#[allow(unsafe_code)]
pub mod fd;
pub mod memory;
pub mod notify;
pub mod paths;
#[allow(unsafe_code)]
pub mod priority;
pub mod signal;
