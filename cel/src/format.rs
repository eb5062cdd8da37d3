//! Kubernetes' format library (`k8s.io/apiserver/pkg/cel/library/format.go`): `format.<name>()`
//! for each named format, `format.named(name)` (an optional), and `f.validate(s)`, which is
//! `optional.none()` for a valid string and otherwise an optional list of the reasons, in
//! apimachinery's words.
//!
//! The CRD formats (`uri`, `uuid`, `byte`, `date`, `datetime`) follow kube-openapi's `strfmt`
//! checks, written out here because their exact acceptance (Go's `time.Parse` layouts, a regex
//! with a free `.`) is what a Policy moved to the API server must keep.
use ::cel::common::types::{CelList, CelOptional, CelString, Kind, STRING_TYPE, Type};
use ::cel::common::value::{CowVal, Val};
use ::cel::{DeclarationError, Env, ExecutionError};

use super::lists::take;
use super::opaque::opaque_val;
use super::url::Url;
use crate::k8s_names;

const FORMAT_TYPE_NAME: &str = "kubernetes.NamedFormat";
static FORMAT_TYPE: Type = format_type();

/// `Type` is not `Clone`: each registration takes its own.
const fn format_type() -> Type {
    Type::simple_type(Kind::Opaque, FORMAT_TYPE_NAME)
}

/// One named format: what `format.<name>()` returns.
#[derive(Clone, Copy, Debug)]
pub struct NamedFormat {
    /// The name after `format.`.
    name: &'static str,
    /// The reasons `text` is not of this format; empty when it is.
    validate: fn(&str) -> Vec<String>,
}

opaque_val!(NamedFormat, FORMAT_TYPE, |a, b| a.name == b.name);

/// Every named format, as `ConstantFormats` lists them.
const FORMATS: &[NamedFormat] = &[
    NamedFormat {
        name: "dns1123Label",
        validate: |s| reasons(k8s_names::is_dns1123_label(s)),
    },
    NamedFormat {
        name: "dns1123Subdomain",
        validate: |s| reasons(k8s_names::is_dns1123_subdomain(s)),
    },
    NamedFormat {
        name: "dns1035Label",
        validate: |s| reasons(k8s_names::is_dns1035_label(s)),
    },
    NamedFormat {
        name: "qualifiedName",
        validate: |s| reasons(k8s_names::is_qualified_name(s)),
    },
    NamedFormat {
        name: "dns1123LabelPrefix",
        validate: |s| reasons(k8s_names::is_dns1123_label(&mask_trailing_dash(s))),
    },
    NamedFormat {
        name: "dns1123SubdomainPrefix",
        validate: |s| reasons(k8s_names::is_dns1123_subdomain(&mask_trailing_dash(s))),
    },
    NamedFormat {
        name: "dns1035LabelPrefix",
        validate: |s| reasons(k8s_names::is_dns1035_label(&mask_trailing_dash(s))),
    },
    NamedFormat {
        name: "labelValue",
        validate: |s| reasons(k8s_names::is_label_value(s)),
    },
    NamedFormat {
        name: "uri",
        validate: |s| Url::request_uri_error(s).into_iter().collect(),
    },
    NamedFormat {
        name: "uuid",
        validate: |s| failing(is_uuid(s), "does not match the UUID format"),
    },
    NamedFormat {
        name: "byte",
        validate: |s| failing(is_base64(s), "invalid base64"),
    },
    NamedFormat {
        name: "date",
        validate: |s| failing(is_date(s), "invalid date"),
    },
    NamedFormat {
        name: "datetime",
        validate: |s| failing(is_date_time(s), "invalid datetime"),
    },
];

fn reasons(result: Result<(), Vec<String>>) -> Vec<String> {
    result.err().unwrap_or_default()
}

fn failing(valid: bool, reason: &str) -> Vec<String> {
    if valid {
        Vec::new()
    } else {
        vec![reason.to_string()]
    }
}

/// apimachinery's `maskTrailingDash`, quirk included: a trailing `-` of a generateName prefix
/// is allowed by replacing the last *two* bytes with `a`.
fn mask_trailing_dash(name: &str) -> String {
    match name.strip_suffix('-') {
        Some(_) if name.len() > 1 => {
            let cut = name.len() - 2;
            // A cut inside a multi-byte character leaves an invalid name, as Go's byte slice
            // does: no format takes U+FFFD.
            name.get(..cut)
                .map_or_else(|| "\u{fffd}".to_string(), |head| format!("{head}a"))
        }
        _ => name.to_string(),
    }
}

/// strfmt's `UUIDPattern`: 32 hex digits in groups of 8-4-4-4-12, each dash optional.
fn is_uuid(text: &str) -> bool {
    let mut rest = text.as_bytes();
    for (i, group) in [8, 4, 4, 4, 12].into_iter().enumerate() {
        if i > 0
            && let Some(after) = rest.strip_prefix(b"-")
        {
            rest = after;
        }
        let Some((digits, after)) = rest.split_at_checked(group) else {
            return false;
        };
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return false;
        }
        rest = after;
    }
    rest.is_empty()
}

/// govalidator's `Base64`: whole quads of the standard alphabet, the last one possibly padded
/// (`xx==`, `xxx=`); the empty string is not base64.
fn is_base64(text: &str) -> bool {
    let bytes = text.as_bytes();
    let alphabet = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/');
    if bytes.is_empty() || !bytes.len().is_multiple_of(4) {
        return false;
    }
    let (body, last) = bytes.split_at(bytes.len() - 4);
    body.iter().all(alphabet)
        && match last {
            [a, b, b'=', b'='] => alphabet(a) && alphabet(b),
            [a, b, c, b'='] => alphabet(a) && alphabet(b) && alphabet(c),
            quad => quad.iter().all(alphabet),
        }
}

/// strfmt's `IsDate`: Go's `time.Parse("2006-01-02", s)`, a real calendar day.
fn is_date(text: &str) -> bool {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<u32> {
        let part = b.get(range)?;
        part.iter()
            .all(u8::is_ascii_digit)
            .then(|| part.iter().fold(0, |n, d| n * 10 + u32::from(d - b'0')))
    };
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let (Some(year), Some(month), Some(day)) = (digits(0..4), digits(5..7), digits(8..10)) else {
        return false;
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days_in_month).contains(&day)
}

/// strfmt's `IsDateTime`: lowercased and split at `t`, a date, then a time matching
/// `^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$` whose hour,
/// minute and second compare (as text) no greater than `23`, `59`, `59`.
fn is_date_time(text: &str) -> bool {
    if text.len() < 4 {
        return false;
    }
    let lower = text.to_lowercase();
    let mut parts = lower.split('t');
    let (Some(date), Some(time)) = (parts.next(), parts.next()) else {
        return false;
    };
    if !is_date(date) {
        return false;
    }
    let clock = |s: &str| s.len() == 2 && s.bytes().all(|b| b.is_ascii_digit());
    let Some((hms, zone)) = time.split_at_checked(8) else {
        return false;
    };
    let fields: Vec<&str> = hms.split(':').collect();
    let [hour, minute, second] = fields.as_slice() else {
        return false;
    };
    if !(clock(hour) && clock(minute) && clock(second)) {
        return false;
    }
    let is_zone = |z: &str| {
        z == "z"
            || z.len() == 6
                && z.starts_with(['+', '-'])
                && z.as_bytes()[3] == b':'
                && clock(&z[1..3])
                && clock(&z[4..6])
    };
    // `(.[0-9]+)?`: any one character but a newline, then the digits, then the zone.
    let fraction_then_zone = zone
        .chars()
        .next()
        .filter(|c| *c != '\n')
        .map(|c| &zone[c.len_utf8()..])
        .is_some_and(|after| {
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            digits > 0 && is_zone(&after[digits..])
        });
    (is_zone(zone) || fraction_then_zone) && *hour <= "23" && *minute <= "59" && *second <= "59"
}

fn format_of(val: &dyn Val) -> Result<&NamedFormat, ExecutionError> {
    val.as_any()
        .and_then(|a| a.downcast_ref::<NamedFormat>())
        .ok_or_else(|| ExecutionError::function_error("validate", "not a format"))
}

/// Registers the library on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_type(format_type())?;
    for format in FORMATS {
        let name = format!("format.{}", format.name);
        env.add_overload(&name, &name, vec![], constant(format.name))?;
    }
    env.add_overload("format.named", "format-named", vec![STRING_TYPE], named)?;
    env.add_member_overload(
        "validate",
        "format-validate",
        format_type(),
        vec![STRING_TYPE],
        validate,
    )?;
    Ok(())
}

/// The function of `format.<name>()`: the overloads are plain `fn`s, so each name gets one.
fn constant(name: &str) -> ::cel::common::functions::Function {
    macro_rules! constants {
        ($($name:literal),*) => {
            match name {
                $($name => |_| by_name($name),)*
                _ => |_| Err(ExecutionError::function_error("format", "no such format")),
            }
        };
    }
    constants!(
        "dns1123Label",
        "dns1123Subdomain",
        "dns1035Label",
        "qualifiedName",
        "dns1123LabelPrefix",
        "dns1123SubdomainPrefix",
        "dns1035LabelPrefix",
        "labelValue",
        "uri",
        "uuid",
        "byte",
        "date",
        "datetime"
    )
}

fn by_name<'b, 'v>(name: &str) -> Result<CowVal<'b, 'v>, ExecutionError> {
    FORMATS
        .iter()
        .find(|f| f.name == name)
        .map(|f| CowVal::owned(*f))
        .ok_or_else(|| ExecutionError::function_error("format", "no such format"))
}

fn named<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [name] = take(args)?;
    let name = <&str>::try_from(name.as_ref())
        .map_err(|_| ExecutionError::function_error("format.named", "not a string"))?;
    let found = FORMATS.iter().find(|f| f.name == name);
    Ok(CowVal::owned(match found {
        Some(format) => CelOptional::of(Box::new(*format)),
        None => CelOptional::none(),
    }))
}

fn validate<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [format, text] = take(args)?;
    let text = <&str>::try_from(text.as_ref())
        .map_err(|_| ExecutionError::function_error("validate", "not a string"))?;
    let reasons = (format_of(format.as_ref())?.validate)(text);
    Ok(CowVal::owned(if reasons.is_empty() {
        CelOptional::none()
    } else {
        let list: Vec<Box<dyn Val>> = reasons
            .into_iter()
            .map(|r| Box::new(CelString::from(r)) as Box<dyn Val>)
            .collect();
        CelOptional::of(Box::new(CelList::from(list)))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_formats_follow_strfmt() {
        assert!(is_uuid("123e4567-e89b-12d3-a456-426614174000"));
        assert!(is_uuid("123E4567E89B12D3A456426614174000"));
        assert!(is_uuid("123e4567-e89b12d3-a456-426614174000"));
        assert!(!is_uuid("123e4567-e89b-12d3-a456-42661417400"));
        assert!(!is_uuid("123e4567--e89b-12d3-a456-426614174000"));
        assert!(is_base64("aGVsbG8="));
        assert!(is_base64("aGk="));
        assert!(!is_base64("aGVsbG8"));
        assert!(!is_base64(""));
        assert!(!is_base64("a==="));
        assert!(is_date("2020-02-29"));
        assert!(!is_date("2021-02-29"));
        assert!(!is_date("2020-1-01"));
        assert!(!is_date("2020-01-32"));
        assert!(is_date_time("2020-01-01T00:00:00Z"));
        assert!(is_date_time("2020-01-01t23:59:59.123+01:00"));
        assert!(is_date_time("2020-01-01T00:00:00+01:00"));
        assert!(is_date_time("2020-01-01T00:00:00x5Z"));
        assert!(!is_date_time("2020-01-01T24:00:00Z"));
        assert!(!is_date_time("2020-01-01T00:00:00"));
        assert!(!is_date_time("2020-01-32T00:00:00Z"));
    }

    #[test]
    fn prefixes_mask_two_bytes() {
        assert_eq!(mask_trailing_dash("my-label-prefix-"), "my-label-prefia");
        assert_eq!(mask_trailing_dash("-"), "-");
        assert_eq!(mask_trailing_dash("abc"), "abc");
    }
}
