//! `gatehouse eval`: evaluate Policies offline against an object or an AdmissionReview, as the
//! API server would call Gatehouse's webhooks (like `kwctl run` or `kyverno apply`).
//!
//! The sequence mirrors the API server's admission chain, so what `eval` prints is what a cluster
//! would do: matching mutating Policies run in (priority, name) order, each seeing the previous
//! one's output; Policies with `reinvocationPolicy: IfNeeded` that ran before a later Policy
//! changed the object are called once more; then every matching validating Policy judges the
//! final object. The namespaceSelector is taken as matching (there are no Namespace labels
//! offline), and `authorizer` is unavailable to match conditions.
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use serde_json::Value;

use super::documents::{self, DocumentsError};
use super::synthetic::{RequestDetails, synthesized};
use crate::controller::wiring::admission_policy::Placement;
use crate::controller::wiring::placement;
use crate::controller::wiring::{Endpoint, Wiring};
use crate::runtime::error_chain::chain;
use gatehouse_api::v1alpha1::{Operation, Policy};
use gatehouse_engine as engine;
use gatehouse_engine::admission::review_value;
use gatehouse_engine::chain;
use gatehouse_engine::{CompiledPolicy, Namespace, Request, Response, ReviewError, parse_request};

/// Exit status when every Policy admitted the request.
pub const ADMITTED: i32 = 0;
/// Exit status when a Policy denied the request.
pub const DENIED: i32 = 1;
/// Exit status for unreadable files, invalid Policies and malformed reviews.
pub const BAD_INPUT: i32 = 2;

/// Arguments of `gatehouse eval`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct EvalArgs {
    /// A Policy file, YAML or JSON; a YAML file may hold several documents. Repeatable.
    #[arg(long = "policy", value_name = "FILE", required = true)]
    pub policies: Vec<PathBuf>,

    /// An admission.k8s.io/v1 AdmissionReview (JSON or YAML) to evaluate.
    #[arg(
        long,
        value_name = "REVIEW.json",
        required_unless_present = "object",
        conflicts_with_all = ["object", "old_object", "namespace", "resource"]
    )]
    pub request: Option<PathBuf>,

    /// The object under review (YAML or JSON); a request is synthesised around it.
    #[arg(long, value_name = "OBJ.yaml")]
    pub object: Option<PathBuf>,

    /// The existing object, for UPDATE (and DELETE, where it defaults to --object).
    #[arg(long, value_name = "OLD.yaml", requires = "object")]
    pub old_object: Option<PathBuf>,

    /// The operation of the synthesised request.
    #[arg(long, default_value = "CREATE", value_parser = parse_operation)]
    pub operation: Operation,

    /// Namespace of the synthesised request; defaults to the object's, else `default` for
    /// namespaced kinds.
    #[arg(long, requires = "object")]
    pub namespace: Option<String>,

    /// Resource (plural, optionally `res/sub`) of the synthesised request; guessed from the kind
    /// when absent.
    #[arg(long, requires = "object")]
    pub resource: Option<String>,

    /// What to print: the AdmissionReview response, or the final object.
    #[arg(long, value_enum, default_value_t = Output::Review)]
    pub output: Output,

    /// Also say, on standard error, where each Policy would run in a cluster whose API server
    /// serves ValidatingAdmissionPolicy v1: in-process, on the webhook (and why), or nowhere.
    #[arg(long)]
    pub explain: bool,
}

/// `--output`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Output {
    /// The AdmissionReview response: patch from the original to the final object, warnings,
    /// denial.
    #[default]
    Review,
    /// The final object, as JSON.
    Object,
}

fn parse_operation(s: &str) -> Result<Operation, String> {
    match s.to_ascii_uppercase().as_str() {
        "CREATE" => Ok(Operation::Create),
        "UPDATE" => Ok(Operation::Update),
        "DELETE" => Ok(Operation::Delete),
        "CONNECT" => Ok(Operation::Connect),
        _ => Err(format!(
            "{s:?} is not an operation: want CREATE, UPDATE, DELETE or CONNECT"
        )),
    }
}

/// Why `eval` could not evaluate: all exit with [`BAD_INPUT`].
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A file could not be read, is not YAML/JSON, or is not one object.
    #[error(transparent)]
    Documents(#[from] DocumentsError),
    /// A policy document is not a Policy, or does not decode as one.
    #[error("{}: document {index}: {message}", .path.display())]
    NotAPolicy {
        path: PathBuf,
        index: usize,
        message: String,
    },
    /// One or more Policies are invalid; each line is `FILE: policy "NAME": PATH: MESSAGE`.
    #[error("invalid Policies:\n{}", .0.join("\n"))]
    InvalidPolicies(Vec<String>),
    /// No Policy document in any file.
    #[error("no Policy found in {0}")]
    NoPolicies(String),
    /// The --object file is not a Kubernetes object.
    #[error("{}: {message}", .path.display())]
    BadObject { path: PathBuf, message: String },
    /// The --request file is not an AdmissionReview.
    #[error("{}", .path.display())]
    Review { path: PathBuf, source: ReviewError },
    /// Printing failed.
    #[error("writing the output: {0}")]
    Write(String),
}

/// The outcome of evaluating every Policy against one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    /// The request as received (or synthesised).
    pub request: Request,
    /// The combined decision: patch from the original to the final object, all warnings, and
    /// the denial message(s).
    pub response: Response,
    /// The object after every mutating Policy that ran (the original when none did).
    pub object: Option<Value>,
}

/// Runs `gatehouse eval`, printing to `out` and diagnostics to `err`; returns the exit status.
pub fn run(args: &EvalArgs, out: &mut impl Write, err: &mut impl Write) -> i32 {
    let admission = match load(args) {
        Ok((request, policies)) => {
            if args.explain {
                for line in explain(&policies) {
                    let _ = writeln!(err, "{line}");
                }
            }
            admit(&request, &policies)
        }
        Err(e) => {
            // Nothing useful is left to do if stderr itself fails.
            let _ = writeln!(err, "gatehouse eval: {}", chain(&e));
            return BAD_INPUT;
        }
    };
    let printed = match args.output {
        Output::Review => review_value(&admission.request, &admission.response),
        Output::Object => admission.object.clone().unwrap_or(Value::Null),
    };
    let written = serde_json::to_string_pretty(&printed)
        .map_err(|e| EvalError::Write(e.to_string()))
        .and_then(|s| writeln!(out, "{s}").map_err(|e| EvalError::Write(e.to_string())));
    if let Err(e) = written {
        let _ = writeln!(err, "gatehouse eval: {}", chain(&e));
        return BAD_INPUT;
    }
    for warning in &admission.response.warnings {
        let _ = writeln!(err, "warning: {warning}");
    }
    if admission.response.allowed() {
        return ADMITTED;
    }
    let message = admission.response.message().unwrap_or("no reason given");
    let _ = writeln!(err, "denied: {message}");
    DENIED
}

/// Where each Policy would run, one line each, as the controller would place it.
pub fn explain(policies: &[CompiledPolicy]) -> Vec<String> {
    let wiring = Wiring {
        endpoint: Endpoint::Url {
            base: String::new(),
        },
        excluded_namespaces: Vec::new(),
        home_namespace: String::new(),
        owner_cluster_role: None,
        owner: None,
        max_admission_policies:
            crate::controller::wiring::in_process_cap::DEFAULT_MAX_ADMISSION_POLICIES,
    };
    let policies: Vec<Policy> = policies
        .iter()
        .map(|p| Policy::new(p.name(), p.spec().clone()))
        .collect();
    let refs: Vec<&Policy> = policies.iter().collect();
    let served = placement::Served {
        validating: true,
        mutating: true,
    };
    // Offline there are no schemas to read: the merges are taken to fit them, into structs
    // that exist.
    let fit = refs
        .iter()
        .map(|p| {
            (
                p.metadata.name.clone().unwrap_or_default(),
                crate::controller::wiring::schema_fit::SchemaFit::Fits(Vec::new()),
            )
        })
        .collect();
    let (placements, _) = placement::place_all(&refs, &wiring, served, &fit);
    placements
        .into_iter()
        .map(|(p, placement)| {
            let placed = match placement {
                Placement::InProcess(objects) => format!(
                    "in-process, as ValidatingAdmissionPolicy {}",
                    objects.policy.metadata.name.unwrap_or_default()
                ),
                Placement::InProcessMutating(generated) => format!(
                    "in-process, in MutatingAdmissionPolicy {generated} (if the fields its merges \
                     name are in the schemas of the kinds it matches)"
                ),
                Placement::Webhook(reason) => format!("webhook: {reason}"),
                Placement::Refused(reason) => {
                    format!("nowhere (enforcement is InProcess): {reason}")
                }
            };
            format!("policy {:?} runs {placed}", kube::ResourceExt::name_any(p))
        })
        .collect()
}

/// Reads and compiles the Policies and reads or synthesises the request.
pub fn load(args: &EvalArgs) -> Result<(Request, Vec<CompiledPolicy>), EvalError> {
    let policies = load_policies(&args.policies)?;
    let request = match &args.request {
        Some(path) => {
            let body = documents::read(path)?;
            // A YAML review is accepted too: parse_request wants JSON bytes.
            let body = match serde_json::from_slice::<Value>(&body) {
                Ok(_) => body,
                Err(_) => match documents::parse(path, &body)?.into_iter().next() {
                    Some(v) => v.to_string().into_bytes(),
                    None => body,
                },
            };
            parse_request(&body).map_err(|source| EvalError::Review {
                path: path.clone(),
                source,
            })?
        }
        None => synthesize(args)?,
    };
    Ok((request, policies))
}

/// Reads every Policy of every file and compiles them, reporting every problem of every Policy
/// (prefixed with its file and name) rather than stopping at the first.
pub fn load_policies(paths: &[PathBuf]) -> Result<Vec<CompiledPolicy>, EvalError> {
    let mut compiled = Vec::new();
    let mut invalid = Vec::new();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    for path in paths {
        for (index, doc) in documents::documents(path)?.into_iter().enumerate() {
            let not_a_policy = |message: String| EvalError::NotAPolicy {
                path: path.clone(),
                index,
                message,
            };
            let Some(decoded) = documents::runnable_policy(&doc) else {
                let field = |f: &str| doc.get(f).and_then(Value::as_str).unwrap_or_default();
                return Err(not_a_policy(format!(
                    "{:?}/{:?} is not a gatehouse.dev/v1alpha1 Policy or NamespacedPolicy",
                    field("apiVersion"),
                    field("kind")
                )));
            };
            let policy = decoded.map_err(not_a_policy)?;
            if doc["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
            {
                return Err(not_a_policy("metadata.name: must be set".to_string()));
            }
            let name = documents::user_name(&policy);
            if let Some(first) = seen.insert(name.clone(), path.clone()) {
                return Err(not_a_policy(format!(
                    "policy {name:?} is already defined in {}",
                    first.display()
                )));
            }
            match engine::compile(&policy) {
                Ok(c) => compiled.push(c),
                Err(e) => invalid.extend(
                    e.problems
                        .iter()
                        .map(|p| format!("{}: policy {name:?}: {p}", path.display())),
                ),
            }
        }
    }
    if !invalid.is_empty() {
        return Err(EvalError::InvalidPolicies(invalid));
    }
    if compiled.is_empty() {
        let files: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(EvalError::NoPolicies(files.join(", ")));
    }
    Ok(compiled)
}

/// Builds the request the API server would send for `--object`.
pub fn synthesize(args: &EvalArgs) -> Result<Request, EvalError> {
    let Some(path) = &args.object else {
        return Err(EvalError::BadObject {
            path: PathBuf::new(),
            message: "either --request or --object is required".to_string(),
        });
    };
    let object = documents::one_object(path)?;
    let old_object = args
        .old_object
        .as_deref()
        .map(documents::one_object)
        .transpose()?;
    let details = RequestDetails {
        operation: args.operation,
        namespace: args.namespace.clone(),
        resource: args.resource.clone(),
        user_info: None,
    };
    synthesized(object, old_object, &details).map_err(|message| EvalError::BadObject {
        path: path.clone(),
        message,
    })
}

/// Plays the admission chain for `request` with the engine's own [`chain::admit`]: the code the
/// webhook runs per entry, offline. Pure: everything `eval` prints is derived from this.
pub fn admit(request: &Request, policies: &[CompiledPolicy]) -> Admission {
    let policies: Vec<&CompiledPolicy> = policies.iter().collect();
    let outcome = chain::admit(request, &policies, Namespace::Assumed);
    let object = outcome.object(request);
    Admission {
        request: request.clone(),
        response: outcome.response,
        object,
    }
}
