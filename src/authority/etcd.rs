//! The embedded authority on etcd (issue #5).
//!

use std::time::Duration;

use super::*;

pub struct EtcdAuthority {
    endpoints: Vec<String>,
}

impl EtcdAuthority {
    pub fn new(endpoints: Vec<String>) -> Self {
        EtcdAuthority { endpoints }
    }
}

impl Authority for EtcdAuthority {
    fn url(&self) -> String {
        format!("etcd://{}", self.endpoints.join(","))
    }
    fn clone_box(&self) -> Box<dyn Authority> {
        Box::new(EtcdAuthority::new(self.endpoints.clone()))
    }
    fn acquire(
        &mut self,
        _req: &AcquireRequest,
        _timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        Err(AcquireError::Transient(
            "etcd authority not built yet".into(),
        ))
    }
    fn renew(&mut self, _lease: &LeaseRef, _timeout: Duration) -> Result<Renewed, RenewError> {
        Err(RenewError::Transient("etcd authority not built yet".into()))
    }
    fn release(
        &mut self,
        _lease: &LeaseRef,
        _o: Outcome,
        _c: Option<i32>,
        _t: Duration,
    ) -> Result<(), RenewError> {
        Err(RenewError::Transient("etcd authority not built yet".into()))
    }
}
