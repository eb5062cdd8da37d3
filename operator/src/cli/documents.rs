//! Reading YAML (or JSON) files for the offline commands, `gatehouse eval` and `gatehouse
//! test`: one reading, one wording of what is wrong with a file.
use std::path::{Path, PathBuf};

use gatehouse_api::v1alpha1::{
    NAMESPACED_POLICY_KIND, NamespacedPolicy, Policy, PolicySource, namespaced_stem, unmarked,
};
use serde_json::Value;

/// Why a file's documents could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DocumentsError {
    /// The file (or folder) could not be read.
    #[error("{}", .path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is not YAML/JSON.
    #[error("{}: not YAML or JSON", .path.display())]
    Parse {
        path: PathBuf,
        // Boxed: the parser's error carries a snippet of the document and is large.
        source: Box<serde_saphyr::Error>,
    },
    /// The file should hold exactly one object.
    #[error("{}: {message}", .path.display())]
    NotOneObject { path: PathBuf, message: String },
}

/// The bytes of `path`.
pub fn read(path: &Path) -> Result<Vec<u8>, DocumentsError> {
    std::fs::read(path).map_err(|source| DocumentsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every non-empty YAML document of `bytes` (read from `path`), as JSON values (JSON is YAML).
pub fn parse(path: &Path, bytes: &[u8]) -> Result<Vec<Value>, DocumentsError> {
    // Empty and null documents are skipped.
    serde_saphyr::from_slice_multiple::<Value>(bytes).map_err(|source| DocumentsError::Parse {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}

/// Every document of the file at `path`.
pub fn documents(path: &Path) -> Result<Vec<Value>, DocumentsError> {
    parse(path, &read(path)?)
}

/// The one object the file at `path` holds.
pub fn one_object(path: &Path) -> Result<Value, DocumentsError> {
    let mut docs = documents(path)?;
    let message = match docs.len() {
        1 if docs[0].is_object() => return Ok(docs.remove(0)),
        1 => "not a Kubernetes object (a mapping with apiVersion and kind)".to_string(),
        n => format!("want exactly one object, found {n} documents"),
    };
    Err(DocumentsError::NotOneObject {
        path: path.to_path_buf(),
        message,
    })
}

/// The Policy a `gatehouse.dev/v1alpha1` Policy or NamespacedPolicy document runs as (a
/// NamespacedPolicy without a namespace is in `default`, where kubectl would apply it); `None`
/// for any other document, an error for one that does not decode.
pub fn runnable_policy(document: &Value) -> Option<Result<Policy, String>> {
    if document["apiVersion"] != "gatehouse.dev/v1alpha1" {
        return None;
    }
    let decoded = match document["kind"].as_str()? {
        "Policy" => serde_json::from_value::<Policy>(document.clone()).map(unmarked),
        NAMESPACED_POLICY_KIND => {
            serde_json::from_value::<NamespacedPolicy>(document.clone()).map(|mut np| {
                np.metadata
                    .namespace
                    .get_or_insert_with(|| "default".into());
                np.scoped_policy()
            })
        }
        _ => return None,
    };
    Some(decoded.map_err(|e| e.to_string()))
}

/// The name the engine runs the Policy `reference` names under: a Policy by its name, a
/// NamespacedPolicy as `namespace/name` (its stem).
pub fn engine_name(reference: &str) -> String {
    match reference.split_once('/') {
        Some((namespace, name)) => namespaced_stem(namespace, name),
        None => reference.to_string(),
    }
}

/// How a user names the Policy the engine runs as `name`: `namespace/name` for a
/// NamespacedPolicy's stem.
pub fn user_name(policy: &Policy) -> String {
    match PolicySource::of(policy) {
        PolicySource::Namespaced { namespace, name } => format!("{namespace}/{name}"),
        PolicySource::Policy { name } => name,
    }
}
