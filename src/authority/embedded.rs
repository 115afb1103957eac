//! The embedded per-host authority: the engine opened in-process on a shared
//! SQLite file (issue #3).

use std::path::PathBuf;
use std::time::Duration;

use super::*;

pub struct EmbeddedAuthority {
    path: PathBuf,
}

impl EmbeddedAuthority {
    pub fn new(path: PathBuf) -> Self {
        EmbeddedAuthority { path }
    }
}

impl Authority for EmbeddedAuthority {
    fn url(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }
    fn clone_box(&self) -> Box<dyn Authority> {
        Box::new(EmbeddedAuthority::new(self.path.clone()))
    }
    fn acquire(
        &mut self,
        _req: &AcquireRequest,
        _timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        Err(AcquireError::Transient(
            "embedded authority not built yet".into(),
        ))
    }
    fn renew(&mut self, _lease: &LeaseRef, _timeout: Duration) -> Result<Renewed, RenewError> {
        Err(RenewError::Transient(
            "embedded authority not built yet".into(),
        ))
    }
    fn release(
        &mut self,
        _lease: &LeaseRef,
        _o: Outcome,
        _c: Option<i32>,
        _t: Duration,
    ) -> Result<(), RenewError> {
        Err(RenewError::Transient(
            "embedded authority not built yet".into(),
        ))
    }
}
