//! Operating-system helpers with no lease logic: the fd operation and the
//! socket option / pre-exec hook that need `unsafe` (`fd`, `priority`),
//! where state and runtime files live, the systemd notification socket, and
//! the agent's defences against memory pressure.

#[allow(unsafe_code)]
pub mod fd;
pub mod memory;
pub mod notify;
pub mod paths;
#[allow(unsafe_code)]
pub mod priority;
pub mod signal;
#[allow(unsafe_code)]
pub mod sqlite_at;
