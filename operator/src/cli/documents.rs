//! Reading YAML (or JSON) files for the offline commands, `gatehouse eval` and `gatehouse
//! test`: one reading, one wording of what is wrong with a file.
use std::path::{Path, PathBuf};

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
