//! Reads the schemas of the kinds mutating Policies match (discovery for the kind, the OpenAPI v3
//! document of its group-version) and judges whether their merges fit
//! ([`super::wiring::schema_fit`]). A judgement is kept per Policy spec; documents are read for
//! a pass and dropped, so memory does not grow with the cluster's APIs.
use std::collections::HashMap;

use kube::{Client, ResourceExt};
use serde_json::Value;
use tracing::debug;

use super::SpecVersion;
use super::wiring::schema_fit::{OptionalStruct, SchemaFit, fits, kind_schema};
use gatehouse_api::v1alpha1::{Enforcement, Policy};
use gatehouse_engine::policy::is_mutating;

/// Judgements of schema fit, by Policy, with the spec each was about.
#[derive(Default)]
pub struct SchemaMemory {
    fits: HashMap<String, RememberedFit>,
}

/// A judgement and what it was made from: the Policy's spec and the version (hash) of each
/// OpenAPI document read. A CRD whose schema changes publishes a new hash, and the Policies
/// matching it are fits again.
struct RememberedFit {
    spec: SpecVersion,
    documents: Vec<(String, String)>,
    fit: SchemaFit,
}

/// Why a judgement could not be made this pass (not remembered: tried again next pass).
struct Unread(String);

/// Whether the merges of every mutating Policy that may run in-process fit the schemas of the
/// kinds it matches, by Policy name.
pub async fn schema_fits(
    client: &Client,
    policies: &[&Policy],
    memory: &mut SchemaMemory,
) -> HashMap<String, SchemaFit> {
    let candidates: Vec<&Policy> = policies
        .iter()
        .copied()
        .filter(|p| is_mutating(&p.spec) && p.spec.enforcement != Enforcement::Webhook)
        .collect();
    memory.fits.retain(|name, fits| {
        candidates
            .iter()
            .any(|p| p.name_any() == *name && SpecVersion::of(p) == fits.spec)
    });
    if candidates.is_empty() {
        return HashMap::new();
    }
    // The versions of the documents, from the index (small): a judgement whose documents
    // changed is made again; without the index, the ones made stand.
    let versions = document_versions(client).await;
    let mut documents: HashMap<String, Option<Value>> = HashMap::new();
    let mut kinds: HashMap<String, Option<Vec<(String, String)>>> = HashMap::new();
    let mut verdicts = HashMap::new();
    for p in candidates {
        let name = p.name_any();
        let current: Option<Vec<(String, String)>> = versions.as_ref().map(|v| {
            document_paths(p)
                .into_iter()
                .map(|path| {
                    let hash = v.get(&path).cloned().unwrap_or_default();
                    (path, hash)
                })
                .collect()
        });
        if let Some(fits) = memory.fits.get(&name)
            && current.as_ref().is_none_or(|c| *c == fits.documents)
        {
            verdicts.insert(name, fits.fit.clone());
            continue;
        }
        match optional_structs(client, p, &mut documents, &mut kinds).await {
            Ok(verdict) => {
                let fit = match verdict {
                    Ok(optional) => SchemaFit::Fits(optional),
                    Err(reason) => SchemaFit::Unfit(reason),
                };
                memory.fits.insert(
                    name.clone(),
                    RememberedFit {
                        spec: SpecVersion::of(p),
                        documents: current.unwrap_or_default(),
                        fit: fit.clone(),
                    },
                );
                verdicts.insert(name, fit);
            }
            Err(Unread(reason)) => {
                debug!(policy = %name, %reason, "schemas not read; tried again next pass");
                verdicts.insert(name, SchemaFit::Unread(reason));
            }
        }
    }
    verdicts
}

/// The OpenAPI v3 documents of the group-versions `p`'s rules name, as the index names them
/// (`api/v1`, `apis/apps/v1`).
fn document_paths(p: &Policy) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for rule in &p.spec.match_.rules {
        for group in &rule.api_groups {
            for version in &rule.api_versions {
                let path = if group.is_empty() {
                    format!("api/{version}")
                } else {
                    format!("apis/{group}/{version}")
                };
                if !paths.contains(&path) {
                    paths.push(path);
                }
            }
        }
    }
    paths
}

/// The hash of every OpenAPI v3 document, by path, from `/openapi/v3`; `None` when the index
/// cannot be read.
async fn document_versions(client: &Client) -> Option<HashMap<String, String>> {
    let request = http::Request::get("/openapi/v3").body(Vec::new()).ok()?;
    let index: Value = match client.request(request).await {
        Ok(index) => index,
        Err(e) => {
            debug!(error = %e, "the OpenAPI v3 index could not be read");
            return None;
        }
    };
    let paths = index.get("paths")?.as_object()?;
    Some(
        paths
            .iter()
            .map(|(path, entry)| {
                let url = entry
                    .get("serverRelativeURL")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let hash = url.split_once("hash=").map(|(_, h)| h).unwrap_or(url);
                (path.clone(), hash.to_string())
            })
            .collect(),
    )
}

async fn optional_structs(
    client: &Client,
    p: &Policy,
    documents: &mut HashMap<String, Option<Value>>,
    kinds: &mut HashMap<String, Option<Vec<(String, String)>>>,
) -> Result<Result<Vec<OptionalStruct>, String>, Unread> {
    // The structs its merges may create, over every kind it matches.
    let mut optional: Vec<OptionalStruct> = Vec::new();
    for (i, rule) in p.spec.match_.rules.iter().enumerate() {
        let wildcard = rule
            .api_groups
            .iter()
            .chain(&rule.api_versions)
            .chain(&rule.resources)
            .any(|v| v.contains('*'));
        if wildcard {
            return Ok(Err(format!(
                "spec.match.rules[{i}]: a wildcard (Gatehouse checks the merges against the \
                 schema of every kind the Policy matches, so it must name them)"
            )));
        }
        for group in &rule.api_groups {
            for version in &rule.api_versions {
                let gv = if group.is_empty() {
                    version.clone()
                } else {
                    format!("{group}/{version}")
                };
                let served = served_kinds(client, &gv, kinds).await?;
                for resource in &rule.resources {
                    let Some(kind) = served
                        .iter()
                        .find(|(r, _)| r == resource)
                        .map(|(_, k)| k.clone())
                    else {
                        return Ok(Err(format!(
                            "spec.match.rules[{i}]: the API server serves no {resource} in {gv}"
                        )));
                    };
                    let Some(document) = document(client, group, &gv, documents).await? else {
                        return Ok(Err(format!(
                            "spec.match.rules[{i}]: the API server publishes no OpenAPI v3 \
                             document for {gv}"
                        )));
                    };
                    let Some(schema) = kind_schema(document, group, version, &kind) else {
                        return Ok(Err(format!(
                            "spec.match.rules[{i}]: the API server publishes no schema for \
                             {kind} in {gv}"
                        )));
                    };
                    match fits(&p.spec.mutate, &schema) {
                        Ok(found) => {
                            for o in found {
                                if !optional.contains(&o) {
                                    optional.push(o);
                                }
                            }
                        }
                        Err(e) => {
                            return Ok(Err(format!(
                                "{e} (a patch naming it fails every request in-process)"
                            )));
                        }
                    }
                }
            }
        }
    }
    Ok(Ok(optional))
}

/// The resources (with their kinds) the API server serves in `gv`; `None` remembered when it
/// serves no such group-version.
async fn served_kinds<'a>(
    client: &Client,
    gv: &str,
    kinds: &'a mut HashMap<String, Option<Vec<(String, String)>>>,
) -> Result<&'a [(String, String)], Unread> {
    if !kinds.contains_key(gv) {
        let listed = if gv.contains('/') {
            client.list_api_group_resources(gv).await
        } else {
            client.list_core_api_resources(gv).await
        };
        let served = match listed {
            Ok(list) => Some(
                list.resources
                    .into_iter()
                    .map(|r| (r.name, r.kind))
                    .collect(),
            ),
            Err(kube::Error::Api(e)) if e.code == 404 => None,
            Err(e) => return Err(Unread(format!("discovery of {gv} failed: {e}"))),
        };
        kinds.insert(gv.to_string(), served);
    }
    Ok(kinds.get(gv).and_then(|k| k.as_deref()).unwrap_or_default())
}

/// The OpenAPI v3 document of `gv`, read once per pass.
async fn document<'a>(
    client: &Client,
    group: &str,
    gv: &str,
    documents: &'a mut HashMap<String, Option<Value>>,
) -> Result<Option<&'a Value>, Unread> {
    if !documents.contains_key(gv) {
        let path = if group.is_empty() {
            format!("/openapi/v3/api/{gv}")
        } else {
            format!("/openapi/v3/apis/{gv}")
        };
        let request = http::Request::get(&path)
            .body(Vec::new())
            .map_err(|e| Unread(format!("building the request for {path}: {e}")))?;
        let read = match client.request::<Value>(request).await {
            Ok(doc) => Some(doc),
            Err(kube::Error::Api(e)) if e.code == 404 => None,
            Err(e) => return Err(Unread(format!("reading {path} failed: {e}"))),
        };
        documents.insert(gv.to_string(), read);
    }
    Ok(documents.get(gv).and_then(Option::as_ref))
}
