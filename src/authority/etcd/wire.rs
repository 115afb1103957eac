//! The JSON shapes of etcd's v3 gateway (grpc-gateway over the gRPC API).
//!
//! Why hand-written: pulling in a gRPC stack for five calls would dwarf the
//! agent. The gateway speaks protobuf-JSON, which has two traps guarded here:
//! - int64 fields (revisions, lease ids, TTLs, counts) are JSON **strings**;
//!   we send them as strings and accept strings or numbers back.
//! - fields at their default value are **omitted** (`succeeded: false`, a
//!   keepalive `TTL` of 0, an empty `kvs`), so every answer field defaults.
//!
//! Keys and values are base64 (`bytes` in protobuf-JSON).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Deserializer, Serialize};

/// Encodes bytes as protobuf-JSON `bytes`.
pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// Decodes protobuf-JSON `bytes`; `None` if it is not base64.
pub fn unb64(s: &str) -> Option<Vec<u8>> {
    B64.decode(s).ok()
}

/// The end of the range holding every key that starts with `prefix`
/// (etcd's `GetPrefixRangeEnd`): the prefix with its last byte below 0xff
/// incremented and what follows dropped.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the keyspace.
    vec![0]
}

/// Serializes an i64 the way protobuf-JSON wants int64: as a string.
fn ser_i64<S: serde::Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

/// Reads an int64 sent as a string (or, leniently, as a number).
fn de_i64<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum StrOrNum {
        S(String),
        N(i64),
    }
    match StrOrNum::deserialize(d)? {
        StrOrNum::N(n) => Ok(n),
        StrOrNum::S(s) => s.parse().map_err(serde::de::Error::custom),
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Header {
    #[serde(default, deserialize_with = "de_i64")]
    pub revision: i64,
}

#[derive(Serialize)]
pub struct LeaseGrantRequest {
    #[serde(rename = "TTL", serialize_with = "ser_i64")]
    pub ttl: i64,
}

#[derive(Deserialize)]
pub struct LeaseGrantResponse {
    #[serde(rename = "ID", default, deserialize_with = "de_i64")]
    pub id: i64,
    #[serde(rename = "TTL", default, deserialize_with = "de_i64")]
    pub ttl: i64,
    /// Set (non-empty) when etcd could not grant.
    #[serde(default)]
    pub error: String,
}

/// Body of `/v3/lease/keepalive` and `/v3/lease/revoke`.
#[derive(Serialize)]
pub struct LeaseIdRequest {
    #[serde(rename = "ID", serialize_with = "ser_i64")]
    pub id: i64,
}

/// The gateway streams keepalive answers as `{"result": {...}}` lines
/// (one per request sent; we send one).
#[derive(Deserialize)]
pub struct KeepAliveStreamItem {
    pub result: Option<KeepAliveResult>,
    pub error: Option<GatewayError>,
}

#[derive(Deserialize)]
pub struct KeepAliveResult {
    #[serde(rename = "TTL", default, deserialize_with = "de_i64")]
    pub ttl: i64,
}

/// `{"error": "...", "message": "...", "code": 5}`: a gRPC status. In a
/// stream (keepalive) the gateway sends `{"error": {"grpc_code": 5,
/// "message": ...}}` instead.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GatewayError {
    #[serde(default)]
    pub message: String,
    #[serde(default, alias = "grpc_code")]
    pub code: i64,
}

/// The etcd errors the client acts on beyond their gRPC code. etcd tells
/// them apart only by their fixed description (its own client does the
/// same: `api/v3rpc/rpctypes`, `ErrorDesc`), so they are recognised here,
/// once, and everything else matches on this type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    /// "authentication is not enabled": a login is not needed.
    AuthNotEnabled,
    /// "invalid auth token": the token expired (authenticate again), or
    /// none was sent.
    InvalidAuthToken,
    /// "revision of auth store is old": authenticate again.
    AuthOldRevision,
    /// "user name is empty": the cluster wants a login.
    UserNameEmpty,
}

impl GatewayError {
    /// Which of the [`Known`] errors this is, if any.
    pub fn known(&self) -> Option<Known> {
        const DESCRIPTIONS: [(&str, Known); 4] = [
            ("authentication is not enabled", Known::AuthNotEnabled),
            ("invalid auth token", Known::InvalidAuthToken),
            ("auth store is old", Known::AuthOldRevision),
            ("user name is empty", Known::UserNameEmpty),
        ];
        DESCRIPTIONS
            .iter()
            .find(|(d, _)| self.message.contains(d))
            .map(|(_, k)| *k)
    }
}

/// Whether a 4xx body without a gRPC status is etcd's gateway refusing a
/// client certificate that carries a Common Name (CVE-2018-16886), the one
/// such refusal it words in plain text.
pub fn refuses_common_name(body: &[u8]) -> bool {
    String::from_utf8_lossy(body).contains("CommonName of client")
}

/// A streamed answer that carries only an error.
#[derive(Deserialize)]
pub struct StreamError {
    pub error: GatewayError,
}

/// Answer of `/v3/lease/timetolive` (-1 once the lease is gone).
#[derive(Deserialize)]
pub struct TimeToLiveResponse {
    #[serde(rename = "TTL", default, deserialize_with = "de_i64")]
    pub ttl: i64,
}

/// gRPC status `INVALID_ARGUMENT` (etcd: "authentication failed", "user
/// name is empty", "revision of auth store is old").
pub const GRPC_INVALID_ARGUMENT: i64 = 3;
/// gRPC status `NOT_FOUND` (etcd: "requested lease not found").
pub const GRPC_NOT_FOUND: i64 = 5;
/// gRPC status `PERMISSION_DENIED` (etcd RBAC: "permission denied").
pub const GRPC_PERMISSION_DENIED: i64 = 7;
/// gRPC status `UNAUTHENTICATED` (etcd: "invalid auth token").
pub const GRPC_UNAUTHENTICATED: i64 = 16;

/// Body of `/v3/auth/authenticate`. Holds the password: no `Debug`.
#[derive(Serialize)]
pub struct AuthenticateRequest<'a> {
    pub name: &'a str,
    pub password: &'a str,
}

#[derive(Deserialize)]
pub struct AuthenticateResponse {
    #[serde(default)]
    pub token: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct RangeRequest {
    pub key: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub range_end: String,
    #[serde(serialize_with = "ser_i64", skip_serializing_if = "is_zero")]
    pub limit: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sort_order: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sort_target: Option<&'static str>,
    #[serde(serialize_with = "ser_i64", skip_serializing_if = "is_zero")]
    pub max_create_revision: i64,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

impl RangeRequest {
    /// One key.
    pub fn key(key: &[u8]) -> Self {
        RangeRequest {
            key: b64(key),
            ..Default::default()
        }
    }

    /// The key under `prefix` with the lowest create revision (the owner of
    /// an etcd mutex: clientv3's `WithFirstCreate`).
    pub fn first_created(prefix: &[u8]) -> Self {
        RangeRequest {
            key: b64(prefix),
            range_end: b64(&prefix_end(prefix)),
            limit: 1,
            sort_order: Some("ASCEND"),
            sort_target: Some("CREATE"),
            max_create_revision: 0,
        }
    }

    /// Every key (`\0` to the end of the keyspace).
    pub fn everything() -> Self {
        RangeRequest {
            key: b64(&[0]),
            range_end: b64(&[0]),
            ..Default::default()
        }
    }

    /// The last key under `prefix` created at or before `max_rev`: the
    /// waiter just ahead of a key created at `max_rev + 1` (the concurrency
    /// package's `waitDeletes` query).
    pub fn last_created_up_to(prefix: &[u8], max_rev: i64) -> Self {
        RangeRequest {
            key: b64(prefix),
            range_end: b64(&prefix_end(prefix)),
            limit: 1,
            sort_order: Some("DESCEND"),
            sort_target: Some("CREATE"),
            max_create_revision: max_rev,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct RangeResponse {
    #[serde(default)]
    pub kvs: Vec<KeyValue>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct KeyValue {
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub value: String,
    #[serde(default, deserialize_with = "de_i64")]
    pub create_revision: i64,
    #[serde(default, deserialize_with = "de_i64")]
    pub lease: i64,
}

impl KeyValue {
    pub fn key_bytes(&self) -> Vec<u8> {
        unb64(&self.key).unwrap_or_default()
    }
    pub fn value_bytes(&self) -> Vec<u8> {
        unb64(&self.value).unwrap_or_default()
    }
}

#[derive(Serialize)]
pub struct PutRequest {
    pub key: String,
    pub value: String,
    #[serde(serialize_with = "ser_i64")]
    pub lease: i64,
}

#[derive(Serialize)]
pub struct Compare {
    pub key: String,
    pub result: &'static str,
    pub target: &'static str,
    #[serde(serialize_with = "ser_i64")]
    pub create_revision: i64,
}

#[derive(Serialize)]
pub enum RequestOp {
    #[serde(rename = "request_range")]
    Range(RangeRequest),
    #[serde(rename = "request_put")]
    Put(PutRequest),
}

#[derive(Serialize)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<RequestOp>,
    pub failure: Vec<RequestOp>,
}

#[derive(Deserialize)]
pub struct TxnResponse {
    #[serde(default)]
    pub header: Header,
    #[serde(default)]
    pub succeeded: bool,
    #[serde(default)]
    pub responses: Vec<ResponseOp>,
}

#[derive(Deserialize)]
pub struct ResponseOp {
    pub response_range: Option<RangeResponse>,
}

impl TxnResponse {
    /// The range answer at position `i`, if that op was a range.
    pub fn range(&self, i: usize) -> Option<&RangeResponse> {
        self.responses
            .get(i)
            .and_then(|r| r.response_range.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"x/"), b"x0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
    }

    #[test]
    fn reads_gateway_answers_with_omitted_defaults() {
        let r: TxnResponse = serde_json::from_str(
            r#"{"header":{"revision":"7"},"responses":[{"response_range":{"header":{"revision":"7"},"kvs":[{"key":"eC8x","create_revision":"3","value":"aGk=","lease":"42"}],"count":"1"}}]}"#,
        )
        .unwrap();
        assert!(!r.succeeded);
        assert_eq!(r.header.revision, 7);
        let kv = &r.range(0).unwrap().kvs[0];
        assert_eq!(kv.key_bytes(), b"x/1");
        assert_eq!(kv.value_bytes(), b"hi");
        assert_eq!((kv.create_revision, kv.lease), (3, 42));
        let k: KeepAliveStreamItem =
            serde_json::from_str(r#"{"result":{"header":{},"ID":"1"}}"#).unwrap();
        assert_eq!(k.result.unwrap().ttl, 0);
    }

    #[test]
    fn sends_int64_as_strings() {
        let s = serde_json::to_string(&LeaseIdRequest { id: 5 }).unwrap();
        assert_eq!(s, r#"{"ID":"5"}"#);
        let s = serde_json::to_string(&RangeRequest::key(b"k")).unwrap();
        assert_eq!(s, r#"{"key":"aw=="}"#);
    }
}
