//! The API server's rules for names and label values, as in apimachinery's
//! `pkg/util/validation`.
//!
//! Gatehouse copies Policy fields into webhook configurations, and the API server refuses the
//! whole configuration (with 422) when one of them breaks these rules, taking every other Policy's
//! entry down with it. So the Policy check has to apply the very same rules, and say why in the
//! API server's own words: each function returns the messages `IsQualifiedName`,
//! `IsValidLabelValue` and `IsDNS1123Subdomain` would, so a user who has met the API server's
//! error recognises it.
//!
//! Lengths count bytes, as Go's `len` does; any non-ASCII character fails the character rules
//! anyway.

/// Longest name part of a qualified name.
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// Longest label value.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// Longest DNS-1123 or DNS-1035 label.
pub const DNS_LABEL_MAX_LENGTH: usize = 63;
/// Longest DNS-1123 subdomain.
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;

const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', \
                                      and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR_MSG: &str = "a valid label must be an empty string or consist of \
                                   alphanumeric characters, '-', '_' or '.', and must start and \
                                   end with an alphanumeric character";
const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case \
                                     alphanumeric characters or '-', and must start and end with \
                                     an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric \
                                     characters or '-', start with an alphabetic character, and \
                                     end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower \
                                         case alphanumeric characters, '-' or '.', and must start \
                                         and end with an alphanumeric character";

/// `IsQualifiedName`: a label key, annotation key or match-condition name, i.e. an optional
/// DNS-1123 subdomain prefix and `/`, then a name part of at most 63 characters
/// (`example.com/MyName`, `my.name`).
pub fn is_qualified_name(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push(format!("prefix part {}", empty_error()));
            } else if let Err(msgs) = is_dns1123_subdomain(prefix) {
                errs.extend(msgs.into_iter().map(|m| format!("prefix part {m}")));
            }
            name
        }
        _ => {
            return Err(vec![format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. \
                 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"]
                )
            )]);
        }
    };
    if name.is_empty() {
        errs.push(format!("name part {}", empty_error()));
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    if !is_qualified_name_part(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    into_result(errs)
}

/// `IsValidLabelValue`: empty, or a qualified name part of at most 63 characters.
pub fn is_label_value(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !value.is_empty() && !is_qualified_name_part(value) {
        errs.push(regex_error(
            LABEL_VALUE_ERR_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    into_result(errs)
}

/// `IsDNS1123Subdomain`: dot-separated lowercase labels of `[a-z0-9-]` that start and end with
/// an alphanumeric, at most 253 characters in all (`example.com`). Unlike a DNS hostname, a
/// single label may be longer than 63 characters: the API server does not limit it.
pub fn is_dns1123_subdomain(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !has_dns1123_subdomain_form(value) {
        errs.push(dns1123_subdomain_form_error());
    }
    into_result(errs)
}

/// `IsDNS1123Label`: lowercase `[a-z0-9-]`, alphanumeric at both ends, at most 63 characters
/// (`my-name`); a valid subdomain that is not a label is told it has dots.
pub fn is_dns1123_label(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > DNS_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS_LABEL_MAX_LENGTH));
    }
    if !has_dns1123_label_form(value) {
        if has_dns1123_subdomain_form(value) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    into_result(errs)
}

/// `IsDNS1035Label`: a DNS-1123 label that starts with a letter (`my-name`).
pub fn is_dns1035_label(value: &str) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    if value.len() > DNS_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS_LABEL_MAX_LENGTH));
    }
    if !(has_dns1123_label_form(value) && value.starts_with(|c: char| c.is_ascii_lowercase())) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    into_result(errs)
}

fn has_dns1123_label_form(label: &str) -> bool {
    edges_are(label, |c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && label
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

/// Whether `value` matches the DNS-1123 subdomain regex, whatever its length.
pub fn has_dns1123_subdomain_form(value: &str) -> bool {
    value.split('.').all(has_dns1123_label_form)
}

/// The message of a value without [`has_dns1123_subdomain_form`].
pub fn dns1123_subdomain_form_error() -> String {
    regex_error(
        DNS1123_SUBDOMAIN_ERR_MSG,
        DNS1123_SUBDOMAIN_FMT,
        &["example.com"],
    )
}

/// apimachinery's `MaxLenError`.
pub fn max_len_error(length: usize) -> String {
    format!("must be no more than {length} characters")
}

/// The qualified-name regex: non-empty, alphanumeric at both ends, `[-A-Za-z0-9_.]` inside.
fn is_qualified_name_part(value: &str) -> bool {
    edges_are(value, |c| c.is_ascii_alphanumeric())
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// Whether `value` is non-empty and its first and last bytes pass `edge`.
fn edges_are(value: &str, edge: impl Fn(u8) -> bool) -> bool {
    match (value.bytes().next(), value.bytes().last()) {
        (Some(first), Some(last)) => edge(first) && edge(last),
        _ => false,
    }
}

fn empty_error() -> &'static str {
    "must be non-empty"
}

/// apimachinery's `RegexError`, to the byte: each example is followed by `, ` and the next one
/// preceded by ` or `, so three examples read `'a',  or 'b',  or 'c', `.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let examples: String = examples
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}'{e}', ", if i > 0 { " or " } else { "" }))
        .collect();
    if examples.is_empty() {
        format!("{msg} (regex used for validation is '{fmt}')")
    } else {
        format!("{msg} (e.g. {examples}regex used for validation is '{fmt}')")
    }
}

fn into_result(errs: Vec<String>) -> Result<(), Vec<String>> {
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names() {
        let max_name = "a".repeat(63);
        let max_prefix = format!("{}.com/name", "p".repeat(249));
        for ok in [
            "a",
            "A",
            "1",
            "MyName",
            "my.name",
            "123-abc",
            "a_b",
            "a-b.c_D9",
            "example.com/name",
            "example.com/MyName",
            "kubernetes.io/metadata.name",
            "app.kubernetes.io/name",
            "a-b.c-d/x",
            "123.com/x",
            max_name.as_str(),
            &format!("example.com/{max_name}"),
            max_prefix.as_str(),
        ] {
            assert_eq!(is_qualified_name(ok), Ok(()), "{ok:?}");
        }
        assert_eq!(max_prefix.split('/').next().map(str::len), Some(253));

        let too_long = "a".repeat(64);
        let prefix_too_long = format!("{}.com/name", "p".repeat(250));
        for bad in [
            "",
            " ",
            "has space",
            "-a",
            "a-",
            "_a",
            "a_",
            ".a",
            "a.",
            "a/b/c",
            "/name",
            "example.com/",
            "Example.com/name",
            "EXAMPLE.COM/name",
            "exa_mple.com/name",
            "-example.com/name",
            "example..com/name",
            "a:b",
            "é",
            too_long.as_str(),
            &format!("example.com/{too_long}"),
            prefix_too_long.as_str(),
        ] {
            assert!(is_qualified_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn qualified_name_messages_match_apimachinery() {
        assert_eq!(
            is_qualified_name("has space"),
            Err(vec![
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must \
                 start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or \
                 '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
                    .to_string()
            ])
        );
        let errs = is_qualified_name("a/b/c").unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(
            errs[0].starts_with("a qualified name must consist of"),
            "{errs:?}"
        );
        assert!(errs[0].ends_with("(e.g. 'example.com/MyName')"), "{errs:?}");
        assert_eq!(
            is_qualified_name("/x"),
            Err(vec!["prefix part must be non-empty".to_string()])
        );
        let errs = is_qualified_name("Example.com/").unwrap_err();
        assert_eq!(errs.len(), 3, "{errs:?}");
        assert!(errs[0].starts_with("prefix part a lowercase RFC 1123 subdomain"));
        assert_eq!(errs[1], "name part must be non-empty");
        assert!(errs[2].starts_with("name part must consist of"));
        assert_eq!(
            is_qualified_name(&"a".repeat(64)),
            Err(vec![
                "name part must be no more than 63 characters".to_string()
            ])
        );
    }

    #[test]
    fn label_values() {
        let max = "v".repeat(63);
        for ok in [
            "",
            "a",
            "Z",
            "9",
            "MyValue",
            "my_value",
            "12345",
            "a.b-c_d",
            max.as_str(),
        ] {
            assert_eq!(is_label_value(ok), Ok(()), "{ok:?}");
        }
        let too_long = "v".repeat(64);
        for bad in [
            " ",
            "x y",
            "-a",
            "a-",
            "_a",
            "a_",
            ".a",
            "a.",
            "a/b",
            "example.com/a",
            "é",
            too_long.as_str(),
        ] {
            assert!(is_label_value(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            is_label_value(&too_long),
            Err(vec!["must be no more than 63 characters".to_string()])
        );
        let errs = is_label_value(&format!("-{max}")).unwrap_err();
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[1].starts_with("a valid label must be an empty string or consist of"));
    }

    #[test]
    fn dns1123_subdomains() {
        let max = format!("{}.b", "a".repeat(251));
        assert_eq!(max.len(), 253);
        for ok in [
            "a",
            "0",
            "example.com",
            "a-b.c-d",
            "a--b",
            "1.2.3",
            "p.gatehouse.dev",
            max.as_str(),
            // No per-label limit of 63.
            &"a".repeat(64),
        ] {
            assert_eq!(is_dns1123_subdomain(ok), Ok(()), "{ok:?}");
        }
        let too_long = format!("{}.b", "a".repeat(252));
        for bad in [
            "",
            ".",
            "A",
            "Example.com",
            "-a",
            "a-",
            "a.-b",
            "a-.b",
            ".a",
            "a.",
            "a..b",
            "a_b",
            "a b",
            "a/b",
            "é",
            too_long.as_str(),
        ] {
            assert!(is_dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            is_dns1123_subdomain(&too_long),
            Err(vec!["must be no more than 253 characters".to_string()])
        );
        assert_eq!(
            is_dns1123_subdomain("Has Space"),
            Err(vec![
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
                 characters, '-' or '.', and must start and end with an alphanumeric character \
                 (e.g. 'example.com', regex used for validation is \
                 '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
                    .to_string()
            ])
        );
    }
}
