//! Kubernetes' URL library (`k8s.io/apiserver/pkg/cel/library/urls.go`): `url(s)`, `isURL(s)`,
//! and on a URL `getScheme()`, `getHost()`, `getHostname()`, `getPort()`, `getEscapedPath()`,
//! `getQuery()`.
//!
//! Kubernetes parses with Go's `net/url`: a string is a URL when `ParseRequestURI` takes it (an
//! absolute URI or an absolute path), and the value is what `Parse` makes of it (the fragment
//! split off). Browsers' URL standard normalises differently (it lowercases hosts, resolves
//! dots), so this follows Go's rules, the parts that these functions can show.
use std::collections::HashMap;

use ::cel::common::types::{
    CelBool, CelList, CelMap, CelMapKey, CelString, Kind, STRING_TYPE, Type,
};
use ::cel::common::value::{CowVal, Val};
use ::cel::{DeclarationError, Env, ExecutionError};

use super::lists::take;
use super::opaque::opaque_val;

const URL_TYPE_NAME: &str = "kubernetes.URL";
static URL_TYPE: Type = url_type();

/// `Type` is not `Clone`: each registration takes its own.
const fn url_type() -> Type {
    Type::simple_type(Kind::Opaque, URL_TYPE_NAME)
}

/// The parts of a URL these functions show, as Go's `url.URL` holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    scheme: String,
    /// `host[:port]`, brackets of an IPv6 address kept.
    host: String,
    /// The path as written (still escaped).
    raw_path: String,
    raw_query: String,
}

impl Url {
    /// `url(s)`: valid by `ParseRequestURI`, parsed as `Parse` does (fragment split off).
    pub fn parse(text: &str) -> Result<Url, String> {
        parse(text, true).map_err(|e| {
            format!("URL parse error during conversion from string: parse {text:?}: {e}")
        })?;
        let without_fragment = text.split_once('#').map_or(text, |(before, _)| before);
        parse(without_fragment, false).map_err(|e| {
            format!("URL parse error during conversion from string: parse {text:?}: {e}")
        })
    }

    /// Go's `url.ParseRequestURI(text)` error, as its `Error()` reads: `parse "<text>": <why>`.
    pub fn request_uri_error(text: &str) -> Option<String> {
        parse(text, true)
            .err()
            .map(|e| format!("parse {text:?}: {e}"))
    }

    fn hostname(&self) -> &str {
        match self.host.strip_prefix('[') {
            Some(rest) => rest.split_once(']').map_or(rest, |(inside, _)| inside),
            None => self
                .host
                .rsplit_once(':')
                .map_or(self.host.as_str(), |(name, _)| name),
        }
    }

    fn port(&self) -> &str {
        let after = match self.host.strip_prefix('[') {
            Some(rest) => rest.split_once(']').map_or("", |(_, after)| after),
            None => self.host.rfind(':').map_or("", |i| &self.host[i..]),
        };
        after.strip_prefix(':').unwrap_or("")
    }

    /// Go's `EscapedPath`: the path as written when that is a valid escaping, else escaped anew.
    fn escaped_path(&self) -> String {
        let valid = self
            .raw_path
            .bytes()
            .all(|b| b == b'%' || !should_escape(b));
        if valid {
            self.raw_path.clone()
        } else {
            unescape(&self.raw_path, false).map_or_else(|_| self.raw_path.clone(), |p| escape(&p))
        }
    }

    /// Go's `Query()`: `&`-separated `key=value` pairs, unescaped (`+` is a space); a pair that
    /// does not unescape, or holds `;`, is left out.
    fn query(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for pair in self.raw_query.split('&').filter(|p| !p.is_empty()) {
            if pair.contains(';') {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Ok(key), Ok(value)) = (unescape(key, true), unescape(value, true)) else {
                continue;
            };
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(value),
                None => out.push((key, vec![value])),
            }
        }
        out
    }
}

/// Go's `url.parse`, as far as these functions need it; `request_uri` is `ParseRequestURI`.
fn parse(text: &str, request_uri: bool) -> Result<Url, String> {
    if text.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    if text.is_empty() && request_uri {
        return Err("empty url".into());
    }
    let (scheme, rest) = split_scheme(text)?;
    let (rest, raw_query) = match rest.split_once('?') {
        Some((before, query)) => (before, query.to_string()),
        None => (rest, String::new()),
    };
    if !rest.starts_with('/') && (request_uri || !scheme.is_empty()) {
        if request_uri {
            return Err("invalid URI for request".into());
        }
        // An opaque URL (`mailto:x`): no host, no path.
        return Ok(Url {
            scheme,
            host: String::new(),
            raw_path: String::new(),
            raw_query,
        });
    }
    let (host, raw_path) = if (!scheme.is_empty() || !request_uri && !rest.starts_with("///"))
        && rest.starts_with("//")
    {
        let authority_and_path = &rest[2..];
        let end = authority_and_path
            .find('/')
            .unwrap_or(authority_and_path.len());
        let (authority, path) = authority_and_path.split_at(end);
        (parse_authority(authority)?, path)
    } else {
        (String::new(), rest)
    };
    unescape(raw_path, false)?;
    Ok(Url {
        scheme,
        host,
        raw_path: raw_path.to_string(),
        raw_query,
    })
}

/// The scheme (lowercased) and the rest; no scheme when the text does not start with one.
fn split_scheme(text: &str) -> Result<(String, &str), String> {
    for (i, c) in text.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err("missing protocol scheme".into()),
            ':' => return Ok((text[..i].to_ascii_lowercase(), &text[i + 1..])),
            _ => return Ok((String::new(), text)),
        }
    }
    Ok((String::new(), text))
}

/// `[userinfo@]host[:port]`: the host with its port, which must be digits.
fn parse_authority(authority: &str) -> Result<String, String> {
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    if let Some(rest) = host.strip_prefix('[') {
        let (_, after) = rest.split_once(']').ok_or("missing ']' in host")?;
        if !after.is_empty() && !valid_port(after) {
            return Err(format!("invalid port {after:?} after host"));
        }
    } else if let Some(i) = host.rfind(':')
        && !valid_port(&host[i..])
    {
        return Err(format!("invalid port {:?} after host", &host[i..]));
    }
    Ok(host.to_string())
}

/// `:` followed by digits only (or nothing).
fn valid_port(port: &str) -> bool {
    port.strip_prefix(':')
        .is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Go's `shouldEscape` for a path: all but the unreserved characters and `$&+,/:;=@`.
fn should_escape(b: u8) -> bool {
    !(b.is_ascii_alphanumeric() || b"-_.~$&+,/:;=@".contains(&b))
}

fn escape(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        if should_escape(b) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(char::from(b));
        }
    }
    out
}

/// Percent-decoding (and, in a query, `+` as a space); a `%` not followed by two hex digits is
/// an error.
fn unescape(text: &str, query: bool) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| {
                        format!(
                            "invalid URL escape {:?}",
                            text.get(i..(i + 3).min(text.len())).unwrap_or("%")
                        )
                    })?;
                out.push(hex);
                i += 3;
            }
            b'+' if query => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|e| e.to_string())
}

opaque_val!(Url, URL_TYPE, |a, b| a == b);

fn receiver<'a>(val: &'a dyn Val, function: &str) -> Result<&'a Url, ExecutionError> {
    val.as_any()
        .and_then(|a| a.downcast_ref::<Url>())
        .ok_or_else(|| ExecutionError::function_error(function, "not a URL"))
}

/// Registers the library on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(url_type())?;
    env.add_overload("url", "string_to_url", vec![STRING_TYPE], url)?;
    env.add_overload("isURL", "is_url_string", vec![STRING_TYPE], is_url)?;
    for (name, op) in [
        (
            "getScheme",
            get_scheme as ::cel::common::functions::Function,
        ),
        ("getHost", get_host),
        ("getHostname", get_hostname),
        ("getPort", get_port),
        ("getEscapedPath", get_escaped_path),
        ("getQuery", get_query),
    ] {
        env.add_member_overload(name, &format!("url.{name}()"), url_type(), vec![], op)?;
    }
    Ok(())
}

fn url<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [text] = take(args)?;
    let text = <&str>::try_from(text.as_ref())
        .map_err(|_| ExecutionError::function_error("url", "not a string"))?;
    let parsed = Url::parse(text).map_err(|e| ExecutionError::function_error("url", e))?;
    Ok(CowVal::owned(parsed))
}

fn is_url<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [text] = take(args)?;
    let valid = <&str>::try_from(text.as_ref()).is_ok_and(|t| parse(t, true).is_ok());
    Ok(CowVal::owned(CelBool::from(valid)))
}

fn part<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    of: fn(&Url) -> String,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    Ok(CowVal::owned(CelString::from(of(receiver(
        this.as_ref(),
        function,
    )?))))
}

fn get_scheme<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    part(args, "getScheme", |u| u.scheme.clone())
}

fn get_host<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    part(args, "getHost", |u| u.host.clone())
}

fn get_hostname<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    part(args, "getHostname", |u| u.hostname().to_string())
}

fn get_port<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    part(args, "getPort", |u| u.port().to_string())
}

fn get_escaped_path<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    part(args, "getEscapedPath", Url::escaped_path)
}

fn get_query<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [this] = take(args)?;
    let mut map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = HashMap::new();
    for (key, values) in receiver(this.as_ref(), "getQuery")?.query() {
        let list: Vec<Box<dyn Val + 'v>> = values
            .into_iter()
            .map(|v| Box::new(CelString::from(v)) as Box<dyn Val + 'v>)
            .collect();
        map.insert(CelMapKey::from(key), Box::new(CelList::from(list)));
    }
    Ok(CowVal::owned(CelMap::from(map)))
}
