//! stub
use super::*;
pub struct HttpAuthority {
    base: String,
}
impl HttpAuthority {
    pub fn new(base: &str) -> Self {
        HttpAuthority {
            base: base.to_string(),
        }
    }
}
impl Authority for HttpAuthority {
    fn url(&self) -> String {
        self.base.clone()
    }
    fn clone_box(&self) -> Box<dyn Authority> {
        Box::new(HttpAuthority::new(&self.base))
    }
    fn acquire(
        &mut self,
        _req: &AcquireRequest,
        _timeout: Duration,
    ) -> Result<Grant, AcquireError> {
        Err(AcquireError::Transient("stub".into()))
    }
    fn renew(&mut self, _lease: &LeaseRef, _timeout: Duration) -> Result<Renewed, RenewError> {
        Err(RenewError::Transient("stub".into()))
    }
    fn release(
        &mut self,
        _lease: &LeaseRef,
        _o: Outcome,
        _c: Option<i32>,
        _t: Duration,
    ) -> Result<(), RenewError> {
        Err(RenewError::Transient("stub".into()))
    }
}
