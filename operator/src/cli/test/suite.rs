//! A test file with everything it names read: the Policies compiled, the resources and the
//! objects it expects, each result expanded to one case per resource.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::file::{Expectation, Expected, FileError, RequestSpec, TestFile};
use gatehouse_api::v1alpha1::Operation;
use gatehouse_engine::admission::UserInfo;
use gatehouse_engine::{CompiledPolicy, compile};

use crate::cli::documents::{self, DocumentsError};
use crate::cli::synthetic::CLUSTER_SCOPED;

/// A test file, read.
#[derive(Debug)]
pub struct Suite {
    /// The test file.
    pub path: PathBuf,
    /// Its `metadata.name`, or its folder when it has none.
    pub name: String,
    pub policies: Vec<CompiledPolicy>,
    pub resources: Vec<Resource>,
    /// Namespace name → labels.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub cases: Vec<Case>,
}

/// One resource of the test.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    /// `namespace/name`, or `name` for a cluster-scoped one.
    pub key: String,
    pub object: Value,
}

/// One (Policy, resource) expectation.
#[derive(Clone, Debug, PartialEq)]
pub struct Case {
    pub policy: String,
    /// Index into [`Suite::resources`].
    pub resource: usize,
    pub expected: Expected,
    pub message: Option<String>,
    /// The object expected to be stored.
    pub patched_resource: Option<Value>,
    pub patches: Option<Vec<Value>>,
    pub request: CaseRequest,
}

/// The request a case's resource comes in by.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CaseRequest {
    pub operation: Option<Operation>,
    pub namespace: Option<String>,
    pub resource: Option<String>,
    pub user_info: Option<UserInfo>,
    pub old_object: Option<Value>,
}

/// Why a test file's contents could not be read: exit 2, like a malformed file.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Documents(#[from] DocumentsError),
    #[error("{}: {message}", .path.display())]
    Content { path: PathBuf, message: String },
    #[error("{}: invalid Policies:\n{}", .path.display(), .problems.join("\n"))]
    InvalidPolicies {
        path: PathBuf,
        problems: Vec<String>,
    },
}

/// Reads the test file at `path` and everything it names.
pub fn load(path: &Path) -> Result<Suite, SuiteError> {
    let test = super::file::read(path)?;
    let base = path.parent().unwrap_or(Path::new("."));
    let policies = load_policies(path, base, &test.policies)?;
    let resources = load_resources(base, &test.resources)?;
    let namespaces = test
        .namespaces
        .iter()
        .map(|n| (n.name.clone(), n.labels.clone()))
        .collect();
    let cases = expand(path, base, &test, &policies, &resources)?;
    let name = if test.metadata.name.is_empty() {
        path.display().to_string()
    } else {
        test.metadata.name.clone()
    };
    Ok(Suite {
        path: path.to_path_buf(),
        name,
        policies,
        resources,
        namespaces,
        cases,
    })
}

/// The files `paths` name: a file itself, a folder's YAML and JSON files in name order.
fn files(base: &Path, paths: &[PathBuf]) -> Result<Vec<PathBuf>, SuiteError> {
    let mut found = Vec::new();
    for path in paths {
        let path = base.join(path);
        if !path.is_dir() {
            found.push(path);
            continue;
        }
        let folder = |source| DocumentsError::Read {
            path: path.clone(),
            source,
        };
        let entries: Vec<PathBuf> = std::fs::read_dir(&path)
            .map_err(folder)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(folder)?;
        let mut inside: Vec<PathBuf> = entries
            .into_iter()
            .filter(|p| {
                p.is_file()
                    && p.extension()
                        .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
                    && p.file_name()
                        .is_some_and(|n| n != super::file::FILE_NAME && n != "kustomization.yaml")
            })
            .collect();
        inside.sort();
        found.extend(inside);
    }
    Ok(found)
}

/// The Policies of `paths`, compiled; every problem of every Policy is reported.
fn load_policies(
    test: &Path,
    base: &Path,
    paths: &[PathBuf],
) -> Result<Vec<CompiledPolicy>, SuiteError> {
    let (mut compiled, mut problems) = (Vec::new(), Vec::new());
    let mut seen = BTreeMap::new();
    for file in files(base, paths)? {
        for document in documents::documents(&file)? {
            let content = |message: String| SuiteError::Content {
                path: file.clone(),
                message,
            };
            let Some(decoded) = documents::runnable_policy(&document) else {
                continue;
            };
            let policy = decoded.map_err(content)?;
            let name = documents::user_name(&policy);
            if let Some(first) = seen.insert(name.clone(), file.clone()) {
                return Err(content(format!(
                    "Policy {name:?} is already defined in {}",
                    first.display()
                )));
            }
            match compile(&policy) {
                Ok(c) => compiled.push(c),
                Err(e) => problems.extend(
                    e.problems
                        .iter()
                        .map(|p| format!("{}: Policy {name:?}: {p}", file.display())),
                ),
            }
        }
    }
    if !problems.is_empty() {
        return Err(SuiteError::InvalidPolicies {
            path: test.to_path_buf(),
            problems,
        });
    }
    if compiled.is_empty() {
        return Err(SuiteError::Content {
            path: test.to_path_buf(),
            message: "policies: no Policy in the files named".to_string(),
        });
    }
    Ok(compiled)
}

/// Every document of `paths`, each a resource with apiVersion, kind and metadata.name.
fn load_resources(base: &Path, paths: &[PathBuf]) -> Result<Vec<Resource>, SuiteError> {
    let mut resources = Vec::new();
    for file in files(base, paths)? {
        for (index, object) in documents::documents(&file)?.into_iter().enumerate() {
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            if name.is_empty() || !object["apiVersion"].is_string() || !object["kind"].is_string() {
                return Err(SuiteError::Content {
                    path: file.clone(),
                    message: format!(
                        "document {index}: a resource needs apiVersion, kind and metadata.name"
                    ),
                });
            }
            // As the request will have it: a namespaced object without a namespace is in
            // `default`, as `kubectl create` puts it.
            let kind = object["kind"].as_str().unwrap_or_default();
            let key = match object["metadata"]["namespace"].as_str() {
                Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
                _ if CLUSTER_SCOPED.contains(&kind) => name.to_string(),
                _ => format!("default/{name}"),
            };
            resources.push(Resource { key, object });
        }
    }
    Ok(resources)
}

/// One object file (an expected object, an old resource), relative to the test file.
fn object_file(base: &Path, path: &Path) -> Result<Value, SuiteError> {
    Ok(documents::one_object(&base.join(path))?)
}

/// The index of the resource `reference` names: its key (`namespace/name`, or `name` for a
/// cluster-scoped one), else a name that is the only one of its kind, else `Kind/key` where
/// kinds share a key.
fn resolve(resources: &[Resource], reference: &str) -> Result<usize, String> {
    let by = |matches: &dyn Fn(&Resource) -> bool| -> Vec<usize> {
        (0..resources.len())
            .filter(|&i| matches(&resources[i]))
            .collect()
    };
    let kind_and_key = |r: &Resource| {
        format!(
            "{}/{}",
            r.object["kind"].as_str().unwrap_or_default(),
            r.key
        )
    };
    let mut hits = by(&|r| r.key == reference);
    if hits.is_empty() {
        hits = by(&|r| kind_and_key(r) == reference);
    }
    if hits.is_empty() {
        hits = by(&|r| r.key.rsplit('/').next() == Some(reference));
    }
    match hits.as_slice() {
        [one] => Ok(*one),
        [] => Err(format!("no resource {reference:?} in the resources named")),
        _ => Err(format!(
            "{reference:?} names {} resources: write namespace/name, or Kind/namespace/name",
            hits.len()
        )),
    }
}

/// One case per (result, resource).
fn expand(
    test: &Path,
    base: &Path,
    file: &TestFile,
    policies: &[CompiledPolicy],
    resources: &[Resource],
) -> Result<Vec<Case>, SuiteError> {
    let field = |field: String, message: String| {
        SuiteError::File(FileError::Field {
            path: test.to_path_buf(),
            field,
            message,
        })
    };
    let mut cases = Vec::new();
    for (i, result) in file.results.iter().enumerate() {
        if !policies
            .iter()
            .any(|p| p.name() == documents::engine_name(&result.policy))
        {
            return Err(field(
                format!("results[{i}].policy"),
                format!("no Policy {:?} in the policies named", result.policy),
            ));
        }
        let request = request(base, result.request.as_ref().unwrap_or(&file.request))?;
        let patched_resource = result
            .patched_resource
            .as_deref()
            .map(|p| object_file(base, p))
            .transpose()?;
        for (j, reference) in result.resources.iter().enumerate() {
            let resource = resolve(resources, reference)
                .map_err(|m| field(format!("results[{i}].resources[{j}]"), m))?;
            cases.push(case(result, resource, &patched_resource, &request));
        }
    }
    Ok(cases)
}

fn case(
    result: &Expectation,
    resource: usize,
    patched_resource: &Option<Value>,
    request: &CaseRequest,
) -> Case {
    Case {
        policy: result.policy.clone(),
        resource,
        expected: result.result,
        message: result.message.clone(),
        patched_resource: patched_resource.clone(),
        patches: result.patches.clone(),
        request: request.clone(),
    }
}

fn request(base: &Path, spec: &RequestSpec) -> Result<CaseRequest, SuiteError> {
    Ok(CaseRequest {
        operation: spec.operation,
        namespace: spec.namespace.clone(),
        resource: spec.resource.clone(),
        user_info: spec.user_info.clone(),
        old_object: spec
            .old_resource
            .as_deref()
            .map(|p| object_file(base, p))
            .transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resource(kind: &str, key: &str) -> Resource {
        Resource {
            key: key.to_string(),
            object: json!({"kind": kind}),
        }
    }

    #[test]
    fn a_reference_takes_the_key_then_kind_and_key_then_a_lone_name() {
        let resources = [
            resource("Namespace", "web"),
            resource("Pod", "web/web"),
            resource("Pod", "shop/cart"),
            resource("Service", "shop/cart"),
            resource("Pod", "shop/db"),
        ];
        assert_eq!(
            resolve(&resources, "web"),
            Ok(0),
            "the key wins over a name"
        );
        assert_eq!(resolve(&resources, "web/web"), Ok(1));
        assert_eq!(resolve(&resources, "db"), Ok(4), "a lone name");
        assert_eq!(resolve(&resources, "Service/shop/cart"), Ok(3));
        let both = resolve(&resources, "shop/cart").unwrap_err();
        assert!(both.contains("Kind/namespace/name"), "{both}");
        assert!(resolve(&resources, "nothing").is_err());
    }
}
