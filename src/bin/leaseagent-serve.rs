//! `leaseagent-serve`: the lease authority, `leaseagent serve`'s binary.
//! `leaseagent serve ARGS` checks ARGS and execs `leaseagent-serve ARGS`;
//! running this directly with the same arguments is the same thing. It is a
//! binary of its own so that the agent, which runs next to every job, does
//! not carry the server's HTTP stack (see `src/cmd/server.rs`).

fn main() -> std::process::ExitCode {
    leaseagent::serve_main()
}
