//! What one CEL expression may cost, so that no Policy can stall admission.
//!
//! **The model.** Evaluating a node of the expression costs 1; a comprehension (the macros
//! `all`, `exists`, `exists_one`, `map`, `filter`) costs its range, plus its condition and step
//! once per element, plus its result; so nested comprehensions multiply. Functions that walk a
//! whole collection (`in` on a list, `join`, `sum`, `min`, `max`, `flatten`, `sort`, `distinct`,
//! `reverse`, `indexOf`, `lastIndexOf`, `isSorted`, `slice`, `find`, `findAll`) cost its size;
//! functions that read a whole string (regexes, the library parsers) a tenth of a step per
//! character. A list or map literal has its own size, `lists.range(k)` yields `k` elements;
//! what `map` or `filter` produce is no larger than their range; any other collection (one read
//! from the request) is assumed to hold `n` elements.
//!
//! **At write time** ([`check`]) `n` is [`ASSUMED_COLLECTION_SIZE`], and an expression estimated
//! over [`COST_BUDGET`] is refused with its estimate. **At run time** the same estimate is made
//! with `n` = the size of the largest collection the request actually holds, before evaluating
//! ([`over_budget`]): past the budget the expression fails like any run-time error (the Policy's
//! failurePolicy decides) and never starts. Estimating before rather than counting during
//! evaluation is what this CEL implementation allows (it has no step counter to interrupt), and
//! the estimate is an upper bound of the work, so nothing over the budget ever runs.
use ::cel::Program;
use ::cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue};

/// Largest estimated cost of one expression. Two comprehensions nested over collections of the
/// assumed size fit (about 10^5 for a typical body); three do not (about 10^7).
pub const COST_BUDGET: u64 = 1_000_000;

/// The budget of one admission call for all of a Policy's validations together, as the API
/// server's `RuntimeCELCostBudget` for a ValidatingAdmissionPolicy binding.
pub const VALIDATIONS_CALL_BUDGET: u64 = 10_000_000;

/// The budget of one admission call for all of a Policy's match conditions together, as the API
/// server's `RuntimeCELCostBudgetMatchConditions`.
pub const MATCH_CONDITIONS_CALL_BUDGET: u64 = 2_500_000;

/// Estimated cost above which an expression is heavy: a comprehension over a collection nested
/// in another (10^4 and more); a single one over a collection of the assumed size stays below.
pub const HEAVY: u64 = 10_000;

/// Assumed size of a collection whose size is unknown when a Policy is written: a Pod's
/// containers, a label map, a Service's ports are well below it.
pub const ASSUMED_COLLECTION_SIZE: u64 = 100;

/// Functions whose cost grows with the size of the collection they are given.
const COLLECTION_FUNCTIONS: &[&str] = &[
    "@in",
    "join",
    "sum",
    "min",
    "max",
    "flatten",
    "sort",
    "sortBy",
    "distinct",
    "isSorted",
    "slice",
    crate::extensions::REVERSE,
    crate::extensions::INDEX_OF,
    crate::extensions::LAST_INDEX_OF,
    "indexOf",
    "lastIndexOf",
    // Kubernetes' regex library: a scan of the string per call.
    "find",
    "findAll",
];

/// The worst-case cost of `program` when no collection from the request holds more than `n`
/// elements.
pub fn estimate(program: &Program, n: u64) -> u64 {
    walk(program.expression(), n).cost
}

/// Whether the cost of `program` depends on the size of collections it reads from the request
/// (it has a comprehension or a collection function over one).
pub fn depends_on_input(program: &Program) -> bool {
    estimate(program, 1) != estimate(program, 2)
}

/// Why an expression is refused when the Policy is written.
pub fn check(program: &Program) -> Result<(), String> {
    let cost = estimate(program, ASSUMED_COLLECTION_SIZE);
    if cost > COST_BUDGET {
        return Err(format!(
            "estimated cost {cost} exceeds the budget of {COST_BUDGET} (nested comprehensions \
             multiply; a collection of unknown size is assumed to hold \
             {ASSUMED_COLLECTION_SIZE} elements)"
        ));
    }
    Ok(())
}

/// At run time, with the largest collection of the request holding `largest` elements: the
/// reason `program` must not run, if its estimate exceeds the budget.
pub fn over_budget(program: &Program, largest: u64) -> Option<String> {
    if largest <= ASSUMED_COLLECTION_SIZE {
        // Within what the write-time check allowed.
        return None;
    }
    over_expression_budget(estimate(program, largest), largest)
}

/// Why an expression estimated at `cost` with collections of up to `largest` elements must not
/// run, if it exceeds the per-expression budget.
pub fn over_expression_budget(cost: u64, largest: u64) -> Option<String> {
    (cost > COST_BUDGET).then(|| {
        format!(
            "cost budget exceeded: with collections of up to {largest} elements the estimated \
             cost is {cost}, over the budget of {COST_BUDGET}; not evaluated"
        )
    })
}

/// What is left of one admission call's budget for a Policy's validations or for its match
/// conditions: each expression is charged its estimate before it runs, and the first one the
/// rest cannot pay for fails, as the API server stops "running out of cost budget".
#[derive(Debug)]
pub struct CallBudget {
    total: u64,
    remaining: u64,
    ran_out: bool,
}

impl CallBudget {
    pub fn validations() -> Self {
        Self::of(VALIDATIONS_CALL_BUDGET)
    }

    pub fn match_conditions() -> Self {
        Self::of(MATCH_CONDITIONS_CALL_BUDGET)
    }

    pub fn of(total: u64) -> Self {
        CallBudget {
            total,
            remaining: total,
            ran_out: false,
        }
    }

    /// Takes `cost` from the budget, or says why the expression must not run.
    pub fn charge(&mut self, cost: u64) -> Result<(), String> {
        match self.remaining.checked_sub(cost) {
            Some(left) => {
                self.remaining = left;
                Ok(())
            }
            None => {
                self.ran_out = true;
                Err(format!(
                    "running out of cost budget: the expressions of this call are estimated at more \
                 than {} in all; not evaluated",
                    self.total
                ))
            }
        }
    }

    /// Whether an expression could not be paid for: the call evaluates no more.
    pub fn ran_out(&self) -> bool {
        self.ran_out
    }
}

/// A node's cost, and the size of the collection it yields when that is known.
struct Walked {
    cost: u64,
    size: Option<u64>,
}

fn walk(expr: &IdedExpr, n: u64) -> Walked {
    let unknown = |cost| Walked { cost, size: None };
    match &expr.expr {
        Expr::Literal(_) | Expr::Ident(_) | Expr::Unspecified => unknown(1),
        Expr::Select(select) => unknown(walk(&select.operand, n).cost.saturating_add(1)),
        Expr::List(list) => Walked {
            cost: list
                .elements
                .iter()
                .fold(1u64, |acc, e| acc.saturating_add(walk(e, n).cost)),
            size: Some(list.elements.len() as u64),
        },
        Expr::Map(map) => Walked {
            cost: entries(&map.entries, n),
            size: Some(map.entries.len() as u64),
        },
        Expr::Struct(s) => unknown(entries(&s.entries, n)),
        Expr::Call(call) => walk_call(call, n),
        Expr::Comprehension(c) => walk_comprehension(c, n),
    }
}

/// What a call's receiver and arguments cost and yield, together.
struct Operands {
    cost: u64,
    /// The largest collection among them.
    largest: u64,
    /// The product of the arguments' sizes (the receiver left out).
    product: u64,
    /// The first argument's size, when known: what `@entries` yields as many pairs of.
    first_arg_size: Option<u64>,
}

fn walk_operands(call: &CallExpr, n: u64) -> Operands {
    let mut walked = Operands {
        cost: 0,
        largest: 0,
        product: 1,
        first_arg_size: None,
    };
    for operand in call.target.iter().map(|t| t.as_ref()).chain(&call.args) {
        let w = walk(operand, n);
        if call.args.first().is_some_and(|a| std::ptr::eq(a, operand)) {
            walked.first_arg_size = w.size;
        }
        walked.cost = walked.cost.saturating_add(w.cost);
        walked.largest = walked.largest.max(w.size.unwrap_or(n));
        if !call
            .target
            .as_deref()
            .is_some_and(|t| std::ptr::eq(t, operand))
        {
            walked.product = walked.product.saturating_mul(w.size.unwrap_or(n).max(1));
        }
    }
    walked
}

/// A call: its operands, plus what the function does with them.
fn walk_call(call: &CallExpr, n: u64) -> Walked {
    let operands = walk_operands(call, n);
    let mut cost = operands.cost.saturating_add(1);
    if STRING_SCANS.contains(&call.func_name.as_str()) {
        cost = cost.saturating_add(scan_cost(call));
    }
    let on_sets =
        matches!(call.target.as_deref().map(|t| &t.expr), Some(Expr::Ident(ns)) if ns == "sets");
    if on_sets {
        // `sets.contains(a, b)` and its kin compare every element of one with the other's.
        cost = cost.saturating_add(operands.product);
    } else if COLLECTION_FUNCTIONS.contains(&call.func_name.as_str()) {
        cost = cost.saturating_add(operands.largest);
    }
    if is_lists_range(call) {
        // `lists.range(k)` yields `k` elements: a constant's value, else as many as any
        // collection of unknown size.
        let size = match call.args.first().map(|a| &a.expr) {
            Some(Expr::Literal(LiteralValue::Int(k))) => {
                u64::try_from(*k.inner()).unwrap_or(0).min(MAX_RANGE)
            }
            _ => n,
        };
        return Walked {
            cost: cost.saturating_add(size),
            size: Some(size),
        };
    }
    // The pairs a two-variable comprehension iterates are as many as its range's elements.
    let size = if call.func_name == crate::comprehensions::ENTRIES {
        operands.first_arg_size
    } else {
        None
    };
    Walked { cost, size }
}

/// A comprehension: its condition and step once per element of its range.
fn walk_comprehension(c: &ComprehensionExpr, n: u64) -> Walked {
    let range = walk(&c.iter_range, n);
    let elements = range.size.unwrap_or(n);
    let per_element = walk(&c.loop_cond, n)
        .cost
        .saturating_add(walk(&c.loop_step, n).cost);
    let cost = range
        .cost
        .saturating_add(walk(&c.accu_init, n).cost)
        .saturating_add(elements.saturating_mul(per_element))
        .saturating_add(walk(&c.result, n).cost);
    // `map` and `filter` yield at most one element per element of their range.
    Walked {
        cost,
        size: Some(elements),
    }
}

/// Functions that read a whole string (a regex, a parse into a quantity, IP, CIDR, URL or
/// version, a format's validation): they cost a tenth of a step per character, as the API
/// server's estimator charges string traversal.
const STRING_SCANS: &[&str] = &[
    crate::regex::MATCHES,
    "startsWith",
    "endsWith",
    "contains",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "split",
    "substring",
    "format",
    "quote",
    "quantity",
    "isQuantity",
    "ip",
    "isIP",
    "cidr",
    "isCIDR",
    "containsIP",
    "containsCIDR",
    "url",
    "isURL",
    "semver",
    "isSemver",
    "validate",
];

/// Length assumed for a string not known when the Policy is written: object names, images and
/// label values are shorter.
const ASSUMED_STRING_LENGTH: u64 = 100;

/// What a [`STRING_SCANS`] call adds: a tenth of a step per character of its longest string
/// operand, one whose length is not a constant counted at [`ASSUMED_STRING_LENGTH`].
fn scan_cost(call: &CallExpr) -> u64 {
    let longest = call
        .target
        .iter()
        .map(|t| t.as_ref())
        .chain(&call.args)
        .map(|operand| match &operand.expr {
            Expr::Literal(LiteralValue::String(s)) => s.inner().chars().count() as u64,
            _ => ASSUMED_STRING_LENGTH,
        })
        .max()
        .unwrap_or(0);
    longest.div_ceil(10).max(1)
}

/// The most elements `lists.range` yields (cel-go's limit, which the `cel` crate keeps).
const MAX_RANGE: u64 = 1_000_000;

fn is_lists_range(call: &CallExpr) -> bool {
    call.func_name == "range"
        && matches!(call.target.as_deref().map(|t| &t.expr), Some(Expr::Ident(ns)) if ns == "lists")
}

fn entries(entries: &[::cel::common::ast::IdedEntryExpr], n: u64) -> u64 {
    entries.iter().fold(1u64, |acc, entry| match &entry.expr {
        EntryExpr::StructField(f) => acc.saturating_add(walk(&f.value, n).cost),
        EntryExpr::MapEntry(m) => acc
            .saturating_add(walk(&m.key, n).cost)
            .saturating_add(walk(&m.value, n).cost),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile;

    fn at(src: &str, n: u64) -> u64 {
        estimate(&compile(src).unwrap(), n)
    }

    #[test]
    fn set_functions_cost_the_product_of_their_lists() {
        let two_inputs = "sets.intersects(object.a, object.b)";
        assert!(at(two_inputs, 100) >= 100 * 100, "{}", at(two_inputs, 100));
        assert!(at(two_inputs, 100) < 100 * 100 + 100);
        // A literal list counts its own size.
        let one_input = "sets.contains(object.a, [1, 2])";
        assert!(
            (200..300).contains(&at(one_input, 100)),
            "{}",
            at(one_input, 100)
        );
        assert!(depends_on_input(&compile(two_inputs).unwrap()));
    }

    #[test]
    fn nested_comprehensions_multiply() {
        let one = at("object.items.all(a, a > 0)", 100);
        let two = at("object.items.all(a, object.items.all(b, a + b > 0))", 100);
        let three = at(
            "object.items.all(a, object.items.all(b, object.items.all(c, a + b + c > 0)))",
            100,
        );
        assert!((100..1_000).contains(&one), "{one}");
        assert!((10_000..100_000).contains(&two), "{two}");
        assert!(three > 1_000_000, "{three}");
        assert!(
            check(&compile("object.items.all(a, object.items.all(b, a + b > 0))").unwrap()).is_ok()
        );
        let err = check(
            &compile(
                "object.items.all(a, object.items.all(b, object.items.all(c, a + b + c > 0)))",
            )
            .unwrap(),
        )
        .unwrap_err();
        assert!(err.contains("exceeds the budget of 1000000"), "{err}");
    }

    #[test]
    fn two_variable_comprehensions_cost_as_one_variable_ones() {
        assert_eq!(
            at("[1, 2, 3].all(i, v, v > i)", 100),
            at("[1, 2, 3].all(i, v, v > i)", 1000),
            "a literal range has its own size"
        );
        let two = at("object.items.all(i, v, v > i)", 100);
        let one = at("object.items.all(v, v > 0)", 100);
        assert!(two > one && two < one * 5, "{two} against {one}");
        let nested = at("object.items.all(i, v, object.items.all(j, w, w > v))", 100);
        assert!(nested > 100 * 100, "{nested}");
    }

    #[test]
    fn literal_ranges_count_their_own_length() {
        // The example: four nested all() over a 40-element literal, 2.56 million steps.
        let list: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        let l = format!("[{}]", list.join(","));
        let src = format!("{l}.all(a, {l}.all(b, {l}.all(c, {l}.all(d, a+b+c+d >= 0))))");
        let p = compile(&src).unwrap();
        let cost = estimate(&p, 1);
        assert!(cost > 2_560_000, "{cost}");
        assert_eq!(
            cost,
            estimate(&p, 1_000),
            "literal sizes do not depend on the input"
        );
        assert!(!depends_on_input(&p));
        assert!(check(&p).unwrap_err().contains("estimated cost"));
        assert!(at("[1, 2, 3].all(x, x > 0)", 100) < 50);
        // `lists.range` yields as many elements as its constant, else an unknown number.
        assert!(at("lists.range(1000).all(i, i >= 0)", 1) > 2_000);
        assert_eq!(
            at("lists.range(1000).all(i, i >= 0)", 1),
            at("lists.range(1000).all(i, i >= 0)", 100)
        );
        assert!(!depends_on_input(
            &compile("lists.range(3).all(i, lists.range(3).all(j, i != j || i == j))").unwrap()
        ));
        assert!(depends_on_input(
            &compile("lists.range(object.spec.replicas).all(i, i >= 0)").unwrap()
        ));
        assert!(
            check(
                &compile("lists.range(1000).all(i, lists.range(1000).all(j, i != j || i == j))")
                    .unwrap()
            )
            .is_err()
        );
    }

    #[test]
    fn macros_and_what_they_yield() {
        // map's output is no larger than its range: iterating it again adds, not multiplies.
        let chained = at("object.items.map(x, x * 2).all(y, y > 0)", 100);
        let nested = at("object.items.all(x, object.items.all(y, x > y))", 100);
        assert!(chained * 10 < nested, "{chained} vs {nested}");
        for src in [
            "object.items.exists(x, x == 1)",
            "object.items.exists_one(x, x == 1)",
            "object.items.filter(x, x > 1).size() > 0",
            "object.metadata.labels.all(k, k.startsWith('a'))",
        ] {
            let p = compile(src).unwrap();
            assert!(depends_on_input(&p), "{src}");
            assert!(estimate(&p, 1_000) > 10 * estimate(&p, 10), "{src}");
        }
    }

    #[test]
    fn string_and_collection_functions() {
        let simple = at(
            "object.metadata.name.startsWith('web-') && object.metadata.name.matches('^[a-z]+$')",
            100,
        );
        assert!(
            (20..50).contains(&simple),
            "a string function costs a tenth of a step per character: {simple}"
        );
        assert!(
            at("quantity('1').isInteger()", 100) < at("quantity(object.spec.cpu).isInteger()", 100),
            "a constant is as long as it is, another string is assumed long"
        );
        assert!(!depends_on_input(
            &compile("object.metadata.name.contains('x')").unwrap()
        ));
        assert!(at("ip(object.a).family() == 4", 100) > at("object.a.size() == 4", 100));
        let joined = at("object.items.join(',') == ''", 100);
        assert!(joined > 100, "join walks the list: {joined}");
        let membership = at("'a' in object.items", 1_000);
        assert!(membership > 1_000, "in walks the list: {membership}");
    }

    #[test]
    fn at_run_time_only_large_collections_are_judged_again() {
        let p = compile("object.items.all(a, object.items.all(b, a + b > 0))").unwrap();
        assert_eq!(over_budget(&p, 100), None);
        let reason = over_budget(&p, 1_000).unwrap();
        assert!(
            reason.contains("cost budget exceeded") && reason.contains("1000 elements"),
            "{reason}"
        );
        assert_eq!(
            over_budget(&compile("object.items.all(a, a > 0)").unwrap(), 10_000),
            None
        );
    }
}
