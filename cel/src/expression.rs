//! A compiled expression, with what its evaluation would otherwise work out on every request.
use ::cel::Program;

use super::CelError;
use super::activation::Bindings;
use super::environment::{run, sized_by};
use crate::cost::{self, ASSUMED_COLLECTION_SIZE, CallBudget};

/// A Policy expression as it is kept between requests: the program, and the variables whose
/// collection sizes decide its cost (`None` when its cost does not depend on the request).
///
/// Worked out once at compile time rather than from the AST on every evaluation, as
/// [`eval_bool`](super::eval_bool) does for a one-off expression.
#[derive(Debug)]
pub struct Expression {
    program: Program,
    sized_by: Option<Vec<&'static str>>,
    /// The estimate with collections of the assumed size: what the expression is charged when
    /// the request holds none larger.
    assumed_cost: u64,
}

impl Expression {
    pub fn new(program: Program) -> Self {
        let sized_by = sized_by(&program);
        let assumed_cost = cost::estimate(&program, ASSUMED_COLLECTION_SIZE);
        Expression {
            program,
            sized_by,
            assumed_cost,
        }
    }

    pub fn program(&self) -> &Program {
        &self.program
    }

    /// [`eval_bool`](super::eval_bool) of the program.
    pub fn eval_bool(&self, vars: &dyn Bindings) -> Result<bool, CelError> {
        // No call budget: only the per-expression one, which `eval_bool_within` checks too.
        self.eval_bool_within(vars, &mut CallBudget::of(u64::MAX))
    }

    /// [`Expression::eval_bool`], charging the expression's estimate to the call's `budget`
    /// first: the assumed-size estimate when the request's collections are no larger, else the
    /// estimate with their actual size (as the per-expression check does).
    pub fn eval_bool_within(
        &self,
        vars: &dyn Bindings,
        budget: &mut CallBudget,
    ) -> Result<bool, CelError> {
        let largest = self
            .sized_by
            .as_deref()
            .map_or(0, |variables| vars.largest_collection(variables) as u64);
        let charged = if largest <= ASSUMED_COLLECTION_SIZE {
            self.assumed_cost
        } else {
            let cost = cost::estimate(&self.program, largest);
            if let Some(reason) = cost::over_expression_budget(cost, largest) {
                return Err(CelError::OverBudget(reason));
            }
            cost
        };
        budget.charge(charged).map_err(CelError::OverBudget)?;
        run(&self.program, vars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Activation, compile, eval_bool};
    use serde_json::json;

    /// The kept analysis decides as the per-evaluation one does: same answers, same budget
    /// refusals, with small and with over-budget collections.
    #[test]
    fn evaluates_as_the_program_does() {
        let small: Vec<i64> = (0..3).collect();
        let large: Vec<i64> = (0..2_000).collect();
        let sources = [
            "object.items.all(a, a >= 0)",
            "object.items.all(a, object.items.all(b, a + b >= 0))",
            "object.items.size() > 1",
            "request.operation == 'CREATE'",
            "object.items.exists(a, a == 2) && request.userInfo.groups.all(g, g != '')",
            "oldObject == null || oldObject.items.all(a, a > 0)",
            "object.missing",
            "1",
        ];
        for items in [&small, &large] {
            let object = json!({"items": items});
            let request = json!({"operation": "CREATE", "userInfo": {"groups": ["devs"]}});
            let vars = Activation::new(Some(&object), None, &request);
            for source in sources {
                let program = compile(source).unwrap();
                let kept = Expression::new(compile(source).unwrap());
                assert_eq!(
                    kept.eval_bool(&vars),
                    eval_bool(&program, &vars),
                    "{source} over {} items",
                    items.len()
                );
            }
        }
        // Charged to a call budget, the same answers while it lasts.
        for items in [&small, &large] {
            let object = json!({"items": items});
            let request = json!({"operation": "CREATE", "userInfo": {"groups": ["devs"]}});
            let vars = Activation::new(Some(&object), None, &request);
            for source in sources {
                let kept = Expression::new(compile(source).unwrap());
                let mut budget = CallBudget::validations();
                assert_eq!(
                    kept.eval_bool_within(&vars, &mut budget),
                    kept.eval_bool(&vars),
                    "{source} over {} items",
                    items.len()
                );
            }
        }
        let over = Expression::new(compile(sources[1]).unwrap());
        let object = json!({"items": large});
        let request = json!({});
        assert!(matches!(
            over.eval_bool(&Activation::new(Some(&object), None, &request)),
            Err(CelError::OverBudget(_))
        ));
    }

    /// A call's expressions share its budget: each is charged its estimate, and the first the
    /// rest cannot pay for is not run.
    #[test]
    fn a_call_budget_runs_out() {
        let object = json!({"items": (0..300).collect::<Vec<i64>>()});
        let request = json!({});
        let vars = Activation::new(Some(&object), None, &request);
        // About 300 × 300 × a few: under the per-expression budget, and twenty of them over
        // the call's.
        let nested = Expression::new(
            compile("object.items.all(a, object.items.exists(b, b == a))").unwrap(),
        );
        let one = cost::estimate(nested.program(), 300);
        assert!(
            one < cost::COST_BUDGET && one * 20 > cost::VALIDATIONS_CALL_BUDGET,
            "{one}"
        );
        let mut budget = CallBudget::validations();
        let runs = (0..20)
            .take_while(|_| nested.eval_bool_within(&vars, &mut budget) == Ok(true))
            .count() as u64;
        assert_eq!(runs, cost::VALIDATIONS_CALL_BUDGET / one);
        let Err(CelError::OverBudget(reason)) = nested.eval_bool_within(&vars, &mut budget) else {
            panic!("the budget should be spent");
        };
        assert!(reason.contains("running out of cost budget"), "{reason}");
        // A fresh call has the whole budget again; small requests are charged the assumed size.
        let small = json!({"items": [1, 2]});
        let vars = Activation::new(Some(&small), None, &request);
        let mut budget = CallBudget::match_conditions();
        assert_eq!(nested.eval_bool_within(&vars, &mut budget), Ok(true));
    }
}
