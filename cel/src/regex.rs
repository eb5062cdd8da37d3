//! Kubernetes' regex library (`k8s.io/apiserver/pkg/cel/library/regex.go`): `find` and `findAll`
//! on strings, beside the standard library's `matches`, all with Go's RE2 syntax.
//!
//! * `s.find(re)`: the first match of `re` in `s`, or `''`;
//! * `s.findAll(re)`: every match, in order; `s.findAll(re, n)`: at most `n` (all for a
//!   negative `n`, none for `0`);
//! * `s.matches(re)`, `matches(s, re)`: whether `re` matches anywhere in `s`.
//!
//! Go's Perl classes are ASCII (`\d` is `[0-9]`, `\w` is `[0-9A-Za-z_]`, `\s` is `[\t\n\f\r ]`,
//! `\b` an ASCII word boundary) where the `regex` crate's are Unicode, and Go refuses a repeat
//! count over 1000: [`go_regex`] writes a pattern so that the crate reads it as Go does. The
//! `cel` crate's own `matches` compiles with the crate's reading, so `matches` is expanded when
//! written into `@matches(s, re)`, which uses [`go_regex`].
//!
//! A pattern that does not compile fails the call; one written as a constant is refused when
//! the Policy is written ([`invalid_constant_patterns`]).
use std::iter::Peekable;
use std::str::Chars;

use ::cel::common::ast::{CallExpr, Expr, IdedExpr, LiteralValue};
use ::cel::common::types::{CelBool, CelInt, CelList, CelString};
use ::cel::common::value::Val;
use ::cel::parser::Macro;
use ::cel::{DeclarationError, Env, ExecutionError, Program};
use regex::Regex;

use super::ast::children;

/// What `s.matches(re)` and `matches(s, re)` are expanded into; `@` keeps it out of what a
/// Policy can write.
pub const MATCHES: &str = "@matches";

/// Functions whose argument is a regular expression.
const PATTERN_FUNCTIONS: &[&str] = &[MATCHES, "find", "findAll"];

/// The largest repeat count Go's RE2 parser takes (`a{1000}`).
const MAX_REPEAT: u64 = 1000;

/// The member function `internal` (one of this module's) was written as.
pub fn written_as(internal: &str) -> Option<&'static str> {
    (internal == MATCHES).then_some("matches")
}

/// Registers `find`, `findAll` and the expansion of `matches` on `env`.
pub fn library(env: &mut Env) -> Result<(), DeclarationError> {
    ::cel::add_member_overload!(env, fn find: (CelString<'_>, CelString<'_>) -> Result<CelString<'_>>)?;
    ::cel::add_member_overload!(env, fn find_all: (CelString<'_>, CelString<'_>) -> Result<CelList<'_>>)?;
    ::cel::add_member_overload!(
        env,
        fn find_all_n: (CelString<'_>, CelString<'_>, CelInt) -> Result<CelList<'_>>,
        name = "findAll"
    )?;
    ::cel::add_overload!(
        env,
        fn matches: (CelString<'_>, CelString<'_>) -> Result<CelBool>,
        name = "@matches"
    )?;
    env.add_macro(Macro::receiver("matches", 1, |helper, target, args| {
        let Some(receiver) = target.take() else {
            return Ok(None);
        };
        let mut call_args = vec![receiver];
        call_args.append(args);
        Ok(Some(helper.next_expr(expanded(call_args))))
    }))?;
    env.add_macro(Macro::global("matches", 2, |helper, _target, args| {
        Ok(Some(helper.next_expr(expanded(std::mem::take(args)))))
    }))
}

fn expanded(args: Vec<IdedExpr>) -> Expr {
    Expr::Call(CallExpr {
        func_name: MATCHES.to_string(),
        target: None,
        args,
    })
}

/// `pattern` compiled as Go's `regexp.Compile` reads it; the reason, on one line, if it does not
/// compile there.
pub fn go_regex(pattern: &str) -> Result<Regex, String> {
    let written = as_go_reads(pattern)?;
    Regex::new(&written).map_err(|e| reason(&e.to_string()))
}

/// `pattern` with Go's ASCII meaning of the Perl classes and word boundaries spelt out for the
/// `regex` crate; a repetition Go refuses is an error.
fn as_go_reads(pattern: &str) -> Result<String, String> {
    let mut reading = GoReading {
        out: String::with_capacity(pattern.len() + 16),
        chars: pattern.chars().peekable(),
        repeats: Repeats::default(),
        in_class: false,
        class_start: false,
    };
    while let Some(c) = reading.chars.next() {
        let first_in_class = std::mem::take(&mut reading.class_start);
        if c == '\\' {
            reading.escape();
        } else if reading.in_class {
            reading.inside_class(c, first_in_class);
        } else {
            reading.outside_class(c)?;
        }
    }
    Ok(reading.out)
}

/// A pattern being rewritten by [`as_go_reads`], and what is known where it has got to.
struct GoReading<'a> {
    out: String,
    chars: Peekable<Chars<'a>>,
    repeats: Repeats,
    /// Inside a bracketed class.
    in_class: bool,
    /// Whether the next character is the class's first (where `]` is literal).
    class_start: bool,
}

impl GoReading<'_> {
    /// What follows a backslash.
    fn escape(&mut self) {
        let Some(escaped) = self.chars.next() else {
            // A trailing backslash: left for the crate to refuse.
            self.out.push('\\');
            return;
        };
        if !self.in_class {
            self.repeats.atom();
        }
        if escaped == 'Q' {
            // `\Q…\E` (or to the end) quotes its text, which the crate does not know.
            let mut quoted = String::new();
            while let Some(q) = self.chars.next() {
                if q == '\\' && self.chars.peek() == Some(&'E') {
                    self.chars.next();
                    break;
                }
                quoted.push(q);
            }
            self.out.push_str(&regex::escape(&quoted));
            return;
        }
        self.out.push_str(&perl_class(escaped, self.in_class));
    }

    /// `c`, read inside a bracketed class.
    fn inside_class(&mut self, c: char, first_in_class: bool) {
        match c {
            '[' if self.chars.peek() == Some(&':') => {
                // `[:alpha:]` and its kin are ASCII in both.
                self.out.push(c);
                for next in self.chars.by_ref() {
                    self.out.push(next);
                    if next == ']' {
                        break;
                    }
                }
            }
            ']' if !first_in_class => {
                self.in_class = false;
                self.repeats.atom();
                self.out.push(c);
            }
            // Go reads these as themselves in a class; the crate would open a nested class or
            // take `&&` and `~~` for set operations.
            '[' | '&' | '~' => {
                self.out.push('\\');
                self.out.push(c);
            }
            _ => self.out.push(c),
        }
    }

    /// `c`, read outside any class; a repetition Go refuses is an error.
    fn outside_class(&mut self, c: char) -> Result<(), String> {
        match c {
            '[' => {
                self.in_class = true;
                self.class_start = true;
                self.out.push(c);
                if self.chars.peek() == Some(&'^') {
                    self.out.push('^');
                    self.chars.next();
                }
            }
            '(' => {
                self.repeats.open();
                self.out.push(c);
            }
            ')' => {
                self.repeats.close();
                self.out.push(c);
            }
            '*' | '+' | '?' => {
                self.repeats.repeat(c, None)?;
                self.out.push(c);
            }
            '{' => {
                let counts: String = self.chars.clone().take_while(|&d| d != '}').collect();
                if is_repeat(&counts) && self.chars.clone().nth(counts.len()) == Some('}') {
                    self.repeats.repeat(c, Some(&counts))?;
                    self.out.push(c);
                    self.out.push_str(&counts);
                    self.out.push('}');
                    // Past the counts and the closing brace.
                    self.chars.nth(counts.len());
                } else {
                    // Go reads a brace that starts no repeat as itself; the crate refuses it.
                    self.repeats.atom();
                    self.out.push_str("\\{");
                }
            }
            _ => {
                self.repeats.atom();
                self.out.push(c);
            }
        }
        Ok(())
    }
}

/// What Go's parser checks of repetitions, followed along a pattern: no repetition of a
/// repetition (`a**`; `a*?` is a lazy `*`), and no nesting of `{n,m}` counts whose product
/// exceeds [`MAX_REPEAT`] (`(a{500}){3}`).
#[derive(Default)]
struct Repeats {
    /// Per open group, the largest product of counts inside it.
    groups: Vec<u64>,
    /// The product of counts the last item repeats (1 for a single atom).
    last: u64,
    /// What the last item was.
    after: Last,
}

#[derive(Default, PartialEq)]
enum Last {
    #[default]
    Atom,
    Repetition,
    LazyRepetition,
}

impl Repeats {
    fn atom(&mut self) {
        self.last = 1;
        self.after = Last::Atom;
    }

    fn open(&mut self) {
        self.groups.push(1);
        self.atom();
    }

    fn close(&mut self) {
        let inner = self.groups.pop().unwrap_or(1);
        self.last = inner;
        self.after = Last::Atom;
        self.record(inner);
    }

    fn record(&mut self, product: u64) {
        if let Some(group) = self.groups.last_mut() {
            *group = (*group).max(product);
        }
    }

    /// The repetition `op` (`*`, `+`, `?`, or `{` with its `counts`) of the last item.
    fn repeat(&mut self, op: char, counts: Option<&str>) -> Result<(), String> {
        match self.after {
            Last::Repetition if op == '?' => {
                self.after = Last::LazyRepetition;
                return Ok(());
            }
            Last::Repetition | Last::LazyRepetition => {
                return Err(format!("invalid nested repetition operator: {op}"));
            }
            Last::Atom => {}
        }
        if let Some(counts) = counts {
            let (min, max) = counts.split_once(',').unwrap_or((counts, counts));
            let parse = |n: &str| n.parse::<u64>().unwrap_or(u64::MAX);
            // Go bounds each count, and the product of nested ones by the larger bound.
            if parse(min) > MAX_REPEAT || (!max.is_empty() && parse(max) > MAX_REPEAT) {
                return Err(format!("invalid repeat count: {{{counts}}}"));
            }
            let bound = if max.is_empty() {
                parse(min)
            } else {
                parse(max)
            };
            let product = self.last.saturating_mul(bound.max(1));
            if bound > 0 && product > MAX_REPEAT {
                return Err(format!("invalid repeat count: {{{counts}}}"));
            }
            self.last = product;
            self.record(product);
        }
        self.after = Last::Repetition;
        Ok(())
    }
}

/// Whether `counts` (what follows a `{` up to `}`) is a repeat: `n`, `n,` or `n,m`.
fn is_repeat(counts: &str) -> bool {
    let mut parts = counts.splitn(2, ',');
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match (parts.next(), parts.next()) {
        (Some(n), None) => digits(n),
        (Some(n), Some(m)) => digits(n) && (m.is_empty() || digits(m)),
        _ => false,
    }
}

/// The escape `\\escaped` as Go reads it, written for the crate.
fn perl_class(escaped: char, in_class: bool) -> String {
    match (escaped, in_class) {
        ('d', false) => "[0-9]".to_string(),
        ('D', false) => "[^0-9]".to_string(),
        ('w', false) => "[0-9A-Za-z_]".to_string(),
        ('W', false) => "[^0-9A-Za-z_]".to_string(),
        ('s', false) => "[\\t\\n\\x0C\\r ]".to_string(),
        ('S', false) => "[^\\t\\n\\x0C\\r ]".to_string(),
        ('b', false) => "(?-u:\\b)".to_string(),
        ('B', false) => "(?-u:\\B)".to_string(),
        ('d', true) => "0-9".to_string(),
        // A negated one is a nested class, which the crate unites with the rest.
        ('D', true) => "[^0-9]".to_string(),
        ('w', true) => "0-9A-Za-z_".to_string(),
        ('W', true) => "[^0-9A-Za-z_]".to_string(),
        ('s', true) => "\\t\\n\\x0C\\r ".to_string(),
        ('S', true) => "[^\\t\\n\\x0C\\r ]".to_string(),
        (other, _) => format!("\\{other}"),
    }
}

fn compile(function: &str, pattern: &CelString<'_>) -> Result<Regex, ExecutionError> {
    go_regex(pattern.inner()).map_err(|e| ExecutionError::function_error(function, e))
}

fn matches(this: &CelString<'_>, pattern: &CelString<'_>) -> Result<CelBool, ExecutionError> {
    let re = compile("matches", pattern)?;
    Ok(CelBool::from(re.is_match(this.inner())))
}

fn find(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
) -> Result<CelString<'static>, ExecutionError> {
    let re = compile("find", pattern)?;
    Ok(re
        .find(this.inner())
        .map(|m| m.as_str().to_string())
        .unwrap_or_default()
        .into())
}

fn find_all(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
) -> Result<CelList<'static>, ExecutionError> {
    find_all_n(this, pattern, &CelInt::from(-1))
}

fn find_all_n(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
    limit: &CelInt,
) -> Result<CelList<'static>, ExecutionError> {
    let re = compile("findAll", pattern)?;
    let limit = usize::try_from(*limit.inner()).unwrap_or(usize::MAX);
    let found: Vec<Box<dyn Val>> = re
        .find_iter(this.inner())
        .take(limit)
        .map(|m| Box::new(CelString::from(m.as_str().to_string())) as Box<dyn Val>)
        .collect();
    Ok(CelList::from(found))
}

/// The constant patterns of `matches`, `find` and `findAll` calls in `program` that do not
/// compile, with the reason: Kubernetes refuses such an expression when it is written.
pub fn invalid_constant_patterns(program: &Program) -> Vec<String> {
    let mut invalid = Vec::new();
    walk(program.expression(), &mut invalid);
    invalid
}

fn walk(expr: &IdedExpr, invalid: &mut Vec<String>) {
    if let Expr::Call(call) = &expr.expr
        && PATTERN_FUNCTIONS.contains(&call.func_name.as_str())
    {
        // `s.find(re[, n])`, or `@matches(s, re)` without a receiver.
        let position = usize::from(call.target.is_none());
        if let Some(Expr::Literal(LiteralValue::String(pattern))) =
            call.args.get(position).map(|a| &a.expr)
            && let Err(e) = go_regex(pattern)
        {
            invalid.push(format!(
                "{}: invalid regular expression {:?}: {e}",
                written_as(&call.func_name).unwrap_or(&call.func_name),
                pattern.to_string(),
            ));
        }
    }
    for child in children(expr) {
        walk(child, invalid);
    }
}

/// The regex crate explains an error over several lines, with a caret diagram, the reason last;
/// a Problem is one line.
fn reason(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.chars().all(|c| c == '^' || c == ' '))
        .unwrap_or(message)
        .to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{Activation, compile, eval_bool};

    /// Evaluates `source` with `object.str` = "this is a 123 string 456", the string of
    /// apiextensions-apiserver's CEL validation tests for `find` and `findAll` (v0.37.2,
    /// `validation_test.go`, where the expressions read `self.str`).
    fn eval(source: &str) -> Result<bool, crate::CelError> {
        let object = json!({"str": "this is a 123 string 456"});
        let request = json!({"operation": "CREATE"});
        eval_bool(
            &compile(source)?,
            &Activation::new(Some(&object), None, &request),
        )
    }

    #[test]
    fn find_and_find_all_answer_as_kubernetes_does() {
        for source in [
            "object.str.find('[0-9]+') == '123'",
            "object.str.find('[0-9]+') != '456'",
            "object.str.find('xyz') == ''",
            "object.str.findAll('[0-9]+') == ['123', '456']",
            "object.str.findAll('[0-9]+', 0) == []",
            "object.str.findAll('[0-9]+', 1) == ['123']",
            "object.str.findAll('[0-9]+', 2) == ['123', '456']",
            "object.str.findAll('[0-9]+', 3) == ['123', '456']",
            "object.str.findAll('[0-9]+', -1) == ['123', '456']",
            "object.str.findAll('xyz') == []",
            "object.str.findAll('xyz', 1) == []",
            // k8s.io/apiserver pkg/cel/library tests.
            "'a 1 b 2'.find('[0-9]') == '1'",
            "'abc 123 def 123'.find('123') == '123'",
            "'abc 123 def 123'.findAll('123') == ['123', '123']",
            "'abc 123 def 123'.findAll('123', 1) == ['123']",
        ] {
            assert_eq!(eval(source), Ok(true), "{source}");
        }
    }

    /// Go's `regexp/syntax` (1.26) reads the Perl classes and `\\b` as ASCII, the `regex` crate
    /// as Unicode; `[:alpha:]` is ASCII in both, `.` any character in both.
    #[test]
    fn perl_classes_and_word_boundaries_are_ascii_as_in_go() {
        for (source, expected) in [
            ("'٣'.matches('^\\\\d$')", false),
            ("'3'.matches('^\\\\d$')", true),
            ("'é'.matches('^\\\\w$')", false),
            ("'é'.matches('^\\\\W$')", true),
            ("'a_1'.matches('^\\\\w+$')", true),
            ("'\\u00a0'.matches('^\\\\s$')", false),
            ("'\\u000b'.matches('^\\\\s$')", false),
            ("'\\t'.matches('^\\\\s$')", true),
            ("'\\u00a0'.matches('^\\\\S$')", true),
            ("'é'.matches('^[\\\\w]$')", false),
            ("'é'.matches('^[\\\\D]$')", true),
            ("'1'.matches('^[^\\\\d]$')", false),
            ("'éa'.matches('\\\\ba')", true),
            ("'é'.matches('^.$') && 'é'.matches('^[[:^alpha:]]$')", true),
            ("'x]'.matches('^[]x]+$')", true),
            ("'٣ 3'.find('\\\\d') == '3'", true),
            ("'a١2b'.findAll('[\\\\d]') == ['2']", true),
            ("matches('a{1000}', 'a{2}')", false),
            ("matches('aa', 'a{2}')", true),
        ] {
            assert_eq!(eval(source), Ok(expected), "{source}");
        }
    }

    #[test]
    fn repeat_counts_over_go_s_limit_do_not_compile() {
        assert!(go_regex("a{1000}").is_ok());
        assert!(go_regex("a{2,1000}").is_ok());
        assert!(
            go_regex("a{1001}")
                .unwrap_err()
                .contains("invalid repeat count")
        );
        assert!(go_regex("a{1,1001}").is_err());
        // Nested counts multiply; a repetition of a repetition is refused, a lazy one is not.
        assert!(go_regex("((a{10}){10}){10}").is_ok());
        assert!(
            go_regex("(a{500}){3}")
                .unwrap_err()
                .contains("invalid repeat count")
        );
        assert!(go_regex("a**").unwrap_err().contains("nested repetition"));
        assert!(go_regex("a{2}{3}").is_err());
        assert!(go_regex("a*?b+?c{2}?").is_ok());
        // Not a repeat: braces Go reads as themselves.
        for literal in ["^a{x}$", "^a{,5}$", "^{$", "^a{2$", "^a}$"] {
            let re = go_regex(literal).unwrap_or_else(|e| panic!("{literal}: {e}"));
            let text: String = literal.trim_matches(|c| c == '^' || c == '$').to_string();
            assert!(re.is_match(&text), "{literal}");
        }
        assert!(go_regex("^\\Qa.b\\E$").unwrap().is_match("a.b"));
        assert!(!go_regex("^\\Qa.b\\E$").unwrap().is_match("axb"));
        let program = compile("object.str.matches('x{2000}')").expect("parses");
        let invalid = invalid_constant_patterns(&program);
        assert_eq!(invalid.len(), 1, "{invalid:?}");
        assert!(
            invalid[0].starts_with("matches: invalid regular expression"),
            "{invalid:?}"
        );
    }

    #[test]
    fn constant_patterns_that_do_not_compile_are_found_when_written() {
        for source in [
            "object.str.find(')') == ''",
            "object.str.findAll(')') == []",
            "object.str.findAll(')', 1) == []",
            "object.str.matches('(')",
        ] {
            let program = compile(source).expect("parses");
            let invalid = invalid_constant_patterns(&program);
            assert_eq!(invalid.len(), 1, "{source}: {invalid:?}");
            assert!(
                invalid[0].contains("invalid regular expression"),
                "{invalid:?}"
            );
        }
        let fine = compile("object.str.matches('^[a-z]+$') && object.str.find(object.re) == ''")
            .expect("parses");
        assert!(invalid_constant_patterns(&fine).is_empty());
        // A pattern known only at run time fails the call.
        let object = json!({"str": "x", "re": ")"});
        let request = json!({"operation": "CREATE"});
        let program = compile("object.str.find(object.re) == ''").expect("parses");
        assert!(eval_bool(&program, &Activation::new(Some(&object), None, &request)).is_err());
    }
}
