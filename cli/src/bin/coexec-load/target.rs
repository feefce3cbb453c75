//! The target: an `http://` address that must resolve to loopback only.
//!
//! The generator is built to overload a server on purpose, so it refuses to
//! aim at anything but this machine. The host is resolved once, every address
//! it resolves to must be loopback, and requests then go to the checked
//! address itself (an IP literal), so a second lookup cannot send them
//! elsewhere.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hyper::Uri;

/// The path requests go to when the target names none.
pub(crate) const DEFAULT_PATH: &str = "/v1/infer";

/// How long a host name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a target is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TargetError {
    #[error("invalid target `{url}`: {detail}")]
    Invalid { url: String, detail: String },
    #[error("target `{url}`: only http:// is supported (no TLS), got `{scheme}`")]
    Scheme { url: String, scheme: String },
    #[error("cannot resolve target host `{host}`: {detail}")]
    Resolve { host: String, detail: String },
    #[error(
        "refusing target `{host}` ({addr}): only loopback addresses \
         (127.0.0.0/8, ::1) may be loaded"
    )]
    NotLoopback { host: String, addr: IpAddr },
}

/// A checked target.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// The URI requests are sent to, with the checked IP literal as its host.
    pub(crate) uri: Uri,
    /// The `Host` header: the authority as the user wrote it.
    pub(crate) host_header: String,
    /// The address connections go to.
    pub(crate) addr: SocketAddr,
}

/// The pieces of a target URL before resolution.
#[derive(Debug, PartialEq, Eq)]
struct Parsed {
    host: String,
    port: u16,
    authority: String,
    path_and_query: String,
}

fn parse(url: &str) -> Result<Parsed, TargetError> {
    let invalid = |detail: &str| TargetError::Invalid {
        url: url.to_string(),
        detail: detail.to_string(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| invalid(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(TargetError::Scheme {
                url: url.to_string(),
                scheme: other.to_string(),
            });
        }
        None => return Err(invalid("expected http://HOST:PORT[/PATH]")),
    }
    let authority = uri.authority().ok_or_else(|| invalid("no host"))?.clone();
    if authority.as_str().contains('@') {
        return Err(invalid("user info is not supported"));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if host.is_empty() {
        return Err(invalid("no host"));
    }
    let path_and_query = match uri.path_and_query().map(|p| p.as_str()) {
        None | Some("") | Some("/") => DEFAULT_PATH.to_string(),
        Some(p) => p.to_string(),
    };
    Ok(Parsed {
        host: host.to_string(),
        port: authority.port_u16().unwrap_or(80),
        authority: authority.as_str().to_string(),
        path_and_query,
    })
}

/// Loopback, counting an IPv4-mapped IPv6 loopback (`::ffff:127.0.0.1`).
fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

/// The address to use, after checking that every one is loopback: the first
/// IPv4 one if any (`localhost` often resolves to `::1` first, while servers,
/// `coexec serve` among them, listen on 127.0.0.1), else the first.
fn pick(host: &str, addrs: &[SocketAddr]) -> Result<SocketAddr, TargetError> {
    if let Some(bad) = addrs.iter().find(|a| !is_loopback(a.ip())) {
        return Err(TargetError::NotLoopback {
            host: host.to_string(),
            addr: bad.ip(),
        });
    }
    let v4 = addrs.iter().find(|a| a.is_ipv4());
    v4.or(addrs.first())
        .copied()
        .ok_or_else(|| TargetError::Resolve {
            host: host.to_string(),
            detail: "no addresses".to_string(),
        })
}

/// The path and query requests to `url` go to (what `--server` keeps of
/// `--target`).
pub(crate) fn path(url: &str) -> Result<String, TargetError> {
    parse(url).map(|p| p.path_and_query)
}

/// Parses `url`, resolves its host and refuses it unless every address is
/// loopback.
pub(crate) async fn resolve(url: &str) -> Result<Target, TargetError> {
    let p = parse(url)?;
    let addrs: Vec<SocketAddr> = match p.host.parse::<IpAddr>() {
        // A literal needs no lookup (and a non-loopback one none either).
        Ok(ip) => vec![SocketAddr::new(ip, p.port)],
        Err(_) => {
            let lookup = tokio::net::lookup_host((p.host.clone(), p.port));
            match tokio::time::timeout(RESOLVE_TIMEOUT, lookup).await {
                Ok(Ok(it)) => it.collect(),
                Ok(Err(e)) => {
                    return Err(TargetError::Resolve {
                        host: p.host,
                        detail: e.to_string(),
                    });
                }
                Err(_) => {
                    return Err(TargetError::Resolve {
                        host: p.host,
                        detail: format!("no answer in {} s", RESOLVE_TIMEOUT.as_secs()),
                    });
                }
            }
        }
    };
    let addr = pick(&p.host, &addrs)?;
    let uri: Uri = format!("http://{addr}{}", p.path_and_query)
        .parse()
        .map_err(|e: hyper::http::uri::InvalidUri| TargetError::Invalid {
            url: url.to_string(),
            detail: e.to_string(),
        })?;
    Ok(Target {
        uri,
        host_header: p.authority,
        addr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_host_port_and_default_path() {
        let p = parse("http://localhost:8080").unwrap();
        assert_eq!(
            p,
            Parsed {
                host: "localhost".into(),
                port: 8080,
                authority: "localhost:8080".into(),
                path_and_query: DEFAULT_PATH.into(),
            }
        );
        let p = parse("http://[::1]:9/x?y=1").unwrap();
        assert_eq!((p.host.as_str(), p.port), ("::1", 9));
        assert_eq!(p.path_and_query, "/x?y=1");
        assert_eq!(parse("http://127.0.0.1").unwrap().port, 80);
        assert_eq!(path("http://127.0.0.1:1/embed").unwrap(), "/embed");
    }

    #[test]
    fn refuses_other_schemes_and_junk() {
        assert!(matches!(
            parse("https://127.0.0.1:1"),
            Err(TargetError::Scheme { .. })
        ));
        assert!(parse("127.0.0.1:80").is_err());
        assert!(matches!(
            parse("http://u:p@127.0.0.1:1"),
            Err(TargetError::Invalid { .. })
        ));
        assert!(matches!(
            parse("not a url"),
            Err(TargetError::Invalid { .. })
        ));
    }

    #[test]
    fn loopback_only() {
        for ok in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ok.parse().unwrap()), "{ok}");
        }
        for bad in [
            "10.0.0.1",
            "0.0.0.0",
            "::",
            "192.168.1.1",
            "8.8.8.8",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_loopback(bad.parse().unwrap()), "{bad}");
        }
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let out: SocketAddr = "10.0.0.1:1".parse().unwrap();
        assert_eq!(pick("h", &[lo]).unwrap(), lo);
        let lo6: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(pick("h", &[lo6, lo]).unwrap(), lo);
        assert_eq!(pick("h", &[lo6]).unwrap(), lo6);
        // One outside address among loopback ones is enough to refuse.
        assert!(matches!(
            pick("h", &[lo, out]),
            Err(TargetError::NotLoopback { .. })
        ));
        assert!(matches!(pick("h", &[]), Err(TargetError::Resolve { .. })));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn resolves_literals_without_lookup() {
        let t = resolve("http://127.0.0.1:5/v1/infer").await.unwrap();
        assert_eq!(t.uri.to_string(), "http://127.0.0.1:5/v1/infer");
        assert_eq!(t.host_header, "127.0.0.1:5");
        assert!(matches!(
            resolve("http://10.0.0.1:5").await,
            Err(TargetError::NotLoopback { .. })
        ));
        let t = resolve("http://[::1]:7").await.unwrap();
        assert_eq!(t.uri.to_string(), "http://[::1]:7/v1/infer");
    }
}
