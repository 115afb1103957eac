//! The names a certificate is known by, read from its DER by hand
//! (trust.md, "Which principal a client certificate is").
//!
//! Why not webpki's own list: `valid_dns_names()` silently drops every DNS
//! SAN it does not accept as a host name (`*.worker-3`, `worker_3..bad`,
//! `worker 3`), and the caller then saw a certificate "without DNS SANs"
//! and fell back to its CN: a certificate issued for `worker-3` with CN
//! `ops` became the `ops` operator. The rule here has no such fallback:
//!
//! - a certificate with a subjectAltName extension is known by its DNS SAN
//!   entries exactly as written (compared case-insensitively by the auth
//!   file), and by nothing else: with only IP, URI or email SANs it has no
//!   name at all (401);
//! - its CN counts only when it has no subjectAltName extension at all;
//! - anything that cannot be read (the DER, the extension, a DNS SAN that
//!   is not printable ASCII, two subjectAltName extensions, two CNs) gives
//!   no name (401), never a guess.
//!
//! The certificate has been verified (chain, validity) by rustls before
//! this runs; this only reads it.

use std::net::IpAddr;

/// Reads one DER TLV: (tag, contents, rest).
fn tlv(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&l0, mut b) = b.split_first()?;
    let len = if l0 < 0x80 {
        usize::from(l0)
    } else {
        let n = usize::from(l0 & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let mut len = 0usize;
        for &x in &b[..n] {
            len = (len << 8) | usize::from(x);
        }
        b = &b[n..];
        len
    };
    if b.len() < len {
        return None;
    }
    Some((tag, &b[..len], &b[len..]))
}

const SEQUENCE: u8 = 0x30;
const OID: u8 = 0x06;
/// id-ce-subjectAltName, 2.5.29.17.
const SAN_OID: &[u8] = &[0x55, 0x1d, 0x11];
/// id-at-commonName, 2.5.4.3.
const CN_OID: &[u8] = &[0x55, 0x04, 0x03];

/// What a certificate says about its names.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Names {
    /// Whether it has a subjectAltName extension.
    pub has_san: bool,
    /// Its dNSName entries, as written.
    pub dns: Vec<String>,
    /// Its iPAddress entries.
    pub ips: Vec<IpAddr>,
    /// Its subject's commonName values.
    pub cns: Vec<String>,
}

/// Reads a certificate's names; `None` if any part of them cannot be read.
pub fn read(der: &[u8]) -> Option<Names> {
    let (tag, cert, _) = tlv(der)?;
    if tag != SEQUENCE {
        return None;
    }
    let (tag, tbs, _) = tlv(cert)?;
    if tag != SEQUENCE {
        return None;
    }
    // version [0] (optional), serial, signature, issuer, validity, subject,
    // spki, then [1], [2] (optional) and [3] extensions.
    let mut rest = tbs;
    let mut fields = Vec::with_capacity(10);
    while !rest.is_empty() {
        let (tag, body, r) = tlv(rest)?;
        fields.push((tag, body));
        rest = r;
    }
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let &(tag, subject) = fields.get(skip + 4)?;
    if tag != SEQUENCE {
        return None;
    }
    let mut names = Names {
        cns: common_names(subject)?,
        ..Names::default()
    };
    let Some(&(_, ext)) = fields.iter().find(|(t, _)| *t == 0xa3) else {
        return Some(names);
    };
    let (tag, mut exts, _) = tlv(ext)?;
    if tag != SEQUENCE {
        return None;
    }
    while !exts.is_empty() {
        let (tag, e, r) = tlv(exts)?;
        exts = r;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, oid, e) = tlv(e)?;
        if tag != OID || oid != SAN_OID {
            continue;
        }
        if names.has_san {
            // Two subjectAltName extensions: which one counts is not ours
            // to choose.
            return None;
        }
        names.has_san = true;
        // critical BOOLEAN DEFAULT FALSE, then the OCTET STRING.
        let (tag, value, r) = tlv(e)?;
        let (tag, value) = if tag == 0x01 {
            let (t, v, _) = tlv(r)?;
            (t, v)
        } else {
            (tag, value)
        };
        if tag != 0x04 {
            return None;
        }
        general_names(value, &mut names)?;
    }
    Some(names)
}

/// The GeneralNames of a subjectAltName extension's value.
fn general_names(value: &[u8], names: &mut Names) -> Option<()> {
    let (tag, mut list, trailing) = tlv(value)?;
    if tag != SEQUENCE || !trailing.is_empty() {
        return None;
    }
    while !list.is_empty() {
        let (tag, v, r) = tlv(list)?;
        list = r;
        match tag {
            // dNSName [2] IA5String: printable ASCII, as written.
            0x82 => {
                if v.is_empty() || !v.iter().all(|b| (0x20..0x7f).contains(b)) {
                    return None;
                }
                names.dns.push(String::from_utf8(v.to_vec()).ok()?);
            }
            // iPAddress [7] OCTET STRING.
            0x87 => match v.len() {
                4 => names.ips.push(IpAddr::from(<[u8; 4]>::try_from(v).ok()?)),
                16 => names.ips.push(IpAddr::from(<[u8; 16]>::try_from(v).ok()?)),
                _ => return None,
            },
            // Any other kind (email, URI, directory name...): no name here.
            _ => {}
        }
    }
    Some(())
}

/// Every commonName of a subject Name (SEQUENCE OF SET OF
/// SEQUENCE { OID, value }); `None` if it cannot be read.
fn common_names(mut name: &[u8]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    while !name.is_empty() {
        let (_, mut set, rest) = tlv(name)?;
        name = rest;
        while !set.is_empty() {
            let (_, atv, rest) = tlv(set)?;
            set = rest;
            let (tag, oid, value) = tlv(atv)?;
            if tag == OID && oid == CN_OID {
                let (tag, v, _) = tlv(value)?;
                // UTF8String, PrintableString, IA5String: others are not text
                // this server reads.
                if !matches!(tag, 0x0c | 0x13 | 0x16) {
                    return None;
                }
                out.push(String::from_utf8(v.to_vec()).ok()?);
            }
        }
    }
    Some(out)
}

/// The names a verified client certificate may match in the auth file
/// (see the module doc); empty: none, so 401.
pub fn principal_names(der: &[u8]) -> Vec<String> {
    match read(der) {
        None => Vec::new(),
        Some(n) if n.has_san => n.dns,
        Some(mut n) if n.cns.len() == 1 => n.cns.pop().into_iter().collect(),
        Some(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_s_common_names_are_read() {
        // SET { SEQ { OID 2.5.4.10 (O), UTF8 "acme" } }, SET { SEQ { OID 2.5.4.3, UTF8 "w1" } }
        let subject = [
            0x31, 0x0d, 0x30, 0x0b, 0x06, 0x03, 0x55, 0x04, 0x0a, 0x0c, 0x04, b'a', b'c', b'm',
            b'e', 0x31, 0x0b, 0x30, 0x09, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x02, b'w', b'1',
        ];
        assert_eq!(common_names(&subject), Some(vec!["w1".to_string()]));
        assert_eq!(common_names(&subject[..15]), Some(Vec::new()));
        assert_eq!(common_names(&subject[..20]), None);
    }

    #[test]
    fn general_names_keep_dns_as_written_and_refuse_what_is_not_text() {
        let mut n = Names::default();
        // SEQ { [2] "*.w", [7] 127.0.0.1, [6] "u:x", [1] "a@b" }
        let v = [
            0x30, 0x15, 0x82, 0x03, b'*', b'.', b'w', 0x87, 0x04, 127, 0, 0, 1, 0x86, 0x03, b'u',
            b':', b'x', 0x81, 0x03, b'a', b'@', b'b',
        ];
        assert_eq!(general_names(&v, &mut n), Some(()));
        assert_eq!(n.dns, vec!["*.w".to_string()]);
        assert_eq!(n.ips, vec![IpAddr::from([127, 0, 0, 1])]);
        let bad = [0x30, 0x04, 0x82, 0x02, 0xc3, 0xa9];
        assert_eq!(general_names(&bad, &mut Names::default()), None);
        let ctl = [0x30, 0x04, 0x82, 0x02, b'a', 0x07];
        assert_eq!(general_names(&ctl, &mut Names::default()), None);
        assert_eq!(read(b"\x30\x03\x02\x01\x00"), None);
    }
}
