//! stub
pub fn main(_cfg: crate::config::RunConfig) -> std::process::ExitCode {
    std::process::ExitCode::from(crate::exit::AGENT_FAILED)
}
