//! What a request must look like before any handler sees it, on every
//! listener (trust.md, "Browsers cannot drive serve").
//!
//! A loopback listener is reachable by every page a local browser opens,
//! and a browser sends some requests cross-site without asking anyone: a
//! "simple" `POST` with `Content-Type: text/plain` carries any body, and a
//! page can point an image or a form at `http://127.0.0.1:7878/...`. With
//! DNS rebinding (`attacker.example` first resolving to the attacker, then
//! to 127.0.0.1) a page can even read the answers, since the browser then
//! counts serve as the page's own origin. Agents and the CLI send none of
//! the headers a browser adds, so refusing them costs those nothing:
//!
//! - a state-changing request (anything but `GET`/`HEAD`) whose
//!   `Content-Type` is not `application/json` (415): a page cannot send that
//!   type cross-site without a CORS preflight, which serve never grants;
//! - any request carrying `Origin` (a browser adds it to cross-origin
//!   requests and to every `POST`), or a `Sec-Fetch-Site` other than `none`
//!   (typed URL, bookmark) or `same-origin` (the status page's own reload)
//!   (403): what a page elsewhere makes the browser send;
//! - any request whose `Host` is not a name of this server (421): a
//!   rebinding page's requests carry its own name (`attacker.example`).
//!   The names: the address the connection arrived on, the `--listen`
//!   host, `localhost` and every loopback address on a loopback listener,
//!   the `--server-name`s, and with TLS the certificate's names (a TLS
//!   client checked the certificate against the name it sends). The port
//!   is not compared: an SSH tunnel or a proxy changes it, rebinding
//!   changes the name;
//! - two `Authorization` headers (400): which one counts would depend on
//!   the reader, so none does.
//!
//! Each refusal happens before the body is read and before any handler
//! runs: nothing is changed.

use std::net::IpAddr;

use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderMap, ORIGIN};

/// A request refused here: status, error code, message.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

fn refuse(status: u16, code: &'static str, message: String) -> Result<(), Refusal> {
    Err(Refusal {
        status,
        code,
        message,
    })
}

/// The names a listener answers to, besides the address a connection
/// arrived on (see the module doc).
#[derive(Clone, Debug, Default)]
pub struct HostNames {
    /// Lowercase host names and IP literals (IPv6 without brackets), no
    /// trailing dot.
    names: Vec<String>,
    /// `*.example.org` certificate names, stored as `.example.org`: they
    /// match exactly one more label.
    wildcards: Vec<String>,
}

impl HostNames {
    /// Adds a name (`--server-name`, the `--listen` host, a certificate's
    /// DNS or IP name).
    pub fn add(&mut self, name: &str) {
        let n = normal(name);
        if n.is_empty() {
            return;
        }
        if let Some(rest) = n.strip_prefix('*') {
            if rest.starts_with('.') && rest.len() > 1 && !self.wildcards.contains(&rest.into()) {
                self.wildcards.push(rest.to_string());
            }
            return;
        }
        if !self.names.contains(&n) {
            self.names.push(n);
        }
    }

    /// The host part of a `Host` value names this server, for a
    /// connection that arrived on `local`.
    pub fn allows(&self, host: &str, local: IpAddr) -> bool {
        let host = normal(host);
        if let Ok(ip) = host.parse::<IpAddr>() {
            let ip = canonical(ip);
            let local = canonical(local);
            return ip == local
                || (local.is_loopback() && ip.is_loopback())
                || self.names.iter().any(|n| n.parse() == Ok(ip));
        }
        if host == "localhost" && canonical(local).is_loopback() {
            return true;
        }
        self.names.contains(&host)
            || self.wildcards.iter().any(|w| {
                host.strip_suffix(w.as_str())
                    .is_some_and(|label| !label.is_empty() && !label.contains('.'))
            })
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// A name or the host part of a `Host` value, lowercase, without port,
/// brackets or trailing dot.
fn normal(host: &str) -> String {
    let h = host.trim();
    let h = if let Some(rest) = h.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        match h.rsplit_once(':') {
            // One colon followed by digits: a port. (More colons: an
            // unbracketed IPv6 literal, as a name may be written.)
            Some((name, port))
                if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) =>
            {
                name
            }
            _ => h,
        }
    };
    h.trim_end_matches('.').to_ascii_lowercase()
}

/// The media type of a `Content-Type` value is `application/json`
/// (parameters such as `charset` allowed).
fn is_json(value: &[u8]) -> bool {
    let Ok(v) = std::str::from_utf8(value) else {
        return false;
    };
    v.split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// Checks a request's head; `Err` is the answer to give instead.
pub fn check(
    method: &hyper::Method,
    uri: &hyper::Uri,
    headers: &HeaderMap,
    names: &HostNames,
    local: IpAddr,
) -> Result<(), Refusal> {
    if headers.get_all(AUTHORIZATION).iter().count() > 1 {
        return refuse(
            400,
            "bad_request",
            "more than one Authorization header".into(),
        );
    }
    if let Some(origin) = headers.get(ORIGIN) {
        return refuse(
            403,
            "forbidden",
            format!(
                "requests from web pages are refused (Origin: {})",
                String::from_utf8_lossy(origin.as_bytes())
            ),
        );
    }
    for site in headers.get_all("sec-fetch-site") {
        let s = site.as_bytes();
        if !s.eq_ignore_ascii_case(b"none") && !s.eq_ignore_ascii_case(b"same-origin") {
            return refuse(
                403,
                "forbidden",
                format!(
                    "requests from other sites are refused (Sec-Fetch-Site: {})",
                    String::from_utf8_lossy(s)
                ),
            );
        }
    }
    let mut hosts = headers.get_all(HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(h), None) => String::from_utf8_lossy(h.as_bytes()).into_owned(),
        (None, _) => return refuse(400, "bad_request", "the Host header is missing".into()),
        (Some(_), Some(_)) => {
            return refuse(400, "bad_request", "more than one Host header".into());
        }
    };
    // An absolute request target names its host too: both must be ours.
    let targets = std::iter::once(host.as_str()).chain(uri.authority().map(|a| a.as_str()));
    for h in targets {
        let h = h.rsplit('@').next().unwrap_or(h);
        if !names.allows(h, local) {
            return refuse(
                421,
                "misdirected_request",
                format!("Host {h:?} is not a name of this server (add it with --server-name NAME)"),
            );
        }
    }
    if method != hyper::Method::GET && method != hyper::Method::HEAD {
        let json = headers
            .get(CONTENT_TYPE)
            .is_some_and(|v| is_json(v.as_bytes()));
        if !json {
            return refuse(
                415,
                "unsupported_media_type",
                format!("{method} needs Content-Type: application/json"),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    const LO: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    fn names(list: &[&str]) -> HostNames {
        let mut n = HostNames::default();
        for x in list {
            n.add(x);
        }
        n
    }

    #[test]
    fn host_names_of_a_loopback_listener_and_configured_ones() {
        let n = names(&["leases.internal", "*.fleet.example", "10.1.2.3"]);
        for ok in [
            "127.0.0.1:7878",
            "localhost:7878",
            "LOCALHOST",
            "[::1]:7878",
            "127.0.0.2",
            "leases.internal",
            "Leases.Internal.:443",
            "w1.fleet.example",
            "10.1.2.3:80",
        ] {
            assert!(n.allows(ok, LO), "{ok}");
        }
        for bad in [
            "attacker.example",
            "attacker.example:7878",
            "localhost.attacker.example",
            "a.b.fleet.example",
            ".fleet.example",
            "fleet.example",
            "10.1.2.4",
            "",
        ] {
            assert!(!n.allows(bad, LO), "{bad}");
        }
        // Off loopback: localhost and loopback literals are not this server.
        let here: IpAddr = "192.0.2.7".parse().unwrap();
        assert!(n.allows("192.0.2.7:7878", here));
        assert!(!n.allows("localhost:7878", here));
        assert!(!n.allows("127.0.0.1", here));
        // An IPv4-mapped connection address is its IPv4 address.
        assert!(n.allows("192.0.2.7", "::ffff:192.0.2.7".parse().unwrap()));
    }

    fn head(list: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in list {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn status(method: &str, list: &[(&'static str, &'static str)]) -> u16 {
        let m = hyper::Method::from_bytes(method.as_bytes()).unwrap();
        let uri: hyper::Uri = "/v1/revoke".parse().unwrap();
        match check(&m, &uri, &head(list), &names(&[]), LO) {
            Ok(()) => 200,
            Err(r) => r.status,
        }
    }

    #[test]
    fn what_agents_send_passes_and_what_browsers_add_is_refused() {
        let json = ("content-type", "application/json");
        let host = ("host", "127.0.0.1:7878");
        assert_eq!(status("POST", &[host, json]), 200);
        assert_eq!(
            status(
                "POST",
                &[host, ("content-type", "Application/JSON; charset=utf-8")]
            ),
            200
        );
        assert_eq!(status("GET", &[host]), 200);
        assert_eq!(status("GET", &[host, ("sec-fetch-site", "none")]), 200);
        assert_eq!(
            status("GET", &[host, ("sec-fetch-site", "same-origin")]),
            200
        );
        assert_eq!(status("POST", &[host, ("content-type", "text/plain")]), 415);
        assert_eq!(status("POST", &[host]), 415);
        assert_eq!(status("DELETE", &[host]), 415);
        assert_eq!(
            status("POST", &[host, json, ("origin", "http://evil.example")]),
            403
        );
        assert_eq!(status("GET", &[host, ("origin", "null")]), 403);
        assert_eq!(
            status("GET", &[host, ("sec-fetch-site", "cross-site")]),
            403
        );
        assert_eq!(status("GET", &[host, ("sec-fetch-site", "same-site")]), 403);
        assert_eq!(status("GET", &[("host", "attacker.example")]), 421);
        assert_eq!(status("GET", &[]), 400);
        assert_eq!(status("GET", &[host, host]), 400);
        assert_eq!(
            status(
                "GET",
                &[
                    host,
                    ("authorization", "Bearer a"),
                    ("authorization", "Bearer b")
                ]
            ),
            400
        );
        // An absolute target naming another host.
        let uri: hyper::Uri = "http://attacker.example/v1/leases".parse().unwrap();
        let r = check(&hyper::Method::GET, &uri, &head(&[host]), &names(&[]), LO);
        assert_eq!(r.unwrap_err().status, 421);
    }
}
