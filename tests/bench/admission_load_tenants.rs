//! The tenants block of the admission-load benchmark (`BLOCK=tenants`): N tenants, each with one
//! mutating and one validating Policy selecting a namespace of its own, and creates in tenant
//! 0's namespace. What a request pays must not grow with the Policies of other tenants: the
//! goal is p99 at N = 256 within 1.15x of N = 1, under `Auto` (in-process: one generated
//! MutatingAdmissionPolicy and one ValidatingAdmissionPolicy per tenant, up to
//! `--max-admission-policies`; the later tenants on the webhook) and under `Webhook`.
//!
//! Every tenant has two namespaces, one whose Policies run under `Auto` and one whose Policies
//! say `Webhook`, so both are measured with the same N installed; with each N the phases (no
//! webhooks, tenant 0 under Auto, tenant 0 on the webhook) take turns, round by round.
//! `TENANTS` (comma-separated, default 1,16,64,256) chooses the steps; `TENANT_MODES=auto` or
//! `=webhook` installs only that mode's Policies (to tell apart what each costs every request
//! of the cluster: the no-webhooks phase pays the API server's own cost of the Policies' objects).
//! The tenants write NamespacedPolicies, as tenants do; `TENANT_KIND=policy` gives each tenant
//! cluster-scoped Policies selecting its namespace instead (the block as it was first run).

use super::*;
use ::gatehouse::controller::wiring::in_process_cap::DEFAULT_MAX_ADMISSION_POLICIES;

/// Namespaces created at once.
const NAMESPACE_BATCH: usize = 32;

/// A tenant's namespaces: its Policies under `Auto` select the first, under `Webhook` the
/// second.
struct Tenant {
    auto: TestNamespace,
    webhook: TestNamespace,
}

/// The mutating and validating Policies of tenant `i` for `ns`, under `enforcement`.
fn tenant_policies(i: usize, ns: &str, enforcement: &str) -> anyhow::Result<(String, Vec<String>)> {
    let tag = enforcement.to_lowercase();
    let m = format!("bench-t{i:03}-{tag}-mutate");
    let v = format!("bench-t{i:03}-{tag}-validate");
    let docs = [
        policy(
            &m,
            ns,
            json!({
                "enforcement": enforcement,
                "mutate": [
                    {"merge": {"metadata": {"labels": {"bench-tenant": format!("t{i}")}}}},
                    {"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}
                ],
            }),
        ),
        policy(
            &v,
            ns,
            json!({
                "enforcement": enforcement,
                "validate": [{"expression": "object.spec.containers.all(c, has(c.resources) && has(c.resources.limits))", "message": "limits required"}],
            }),
        ),
    ]
    .into_iter()
    .map(|p| if namespaced() { as_namespaced(p, ns) } else { p })
    .map(|p| serde_json::to_string(&p).map(|p| format!("---\n{p}\n")))
    .collect::<Result<String, _>>()?;
    Ok((docs, vec![m, v]))
}

/// Whether the tenants write NamespacedPolicies (`TENANT_KIND`, default `namespaced`).
fn namespaced() -> bool {
    std::env::var("TENANT_KIND").map_or(true, |kind| !kind.eq_ignore_ascii_case("policy"))
}

/// The bench Policy `p` as the NamespacedPolicy of `ns`: its own namespace needs no selector.
fn as_namespaced(mut p: Value, ns: &str) -> Value {
    p["kind"] = json!("NamespacedPolicy");
    p["metadata"]["namespace"] = json!(ns);
    if let Some(m) = p["spec"]["match"].as_object_mut() {
        m.remove("namespaceSelector");
    }
    p
}

/// Waits until a dry-run create in tenant 0's namespaces carries its label.
async fn await_in_effect(apis: &[&Api<Pod>]) -> anyhow::Result<()> {
    let probe = pod("probe")?;
    await_condition(
        "tenant 0's Policies in effect",
        Duration::from_secs(120),
        || async {
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            for api in apis {
                let created = api.create(&dry_run, &probe).await?;
                let labels = created.metadata.labels.unwrap_or_default();
                if labels.get("bench-tenant").map(String::as_str) != Some("t0") {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await
}

/// Whether the Policies of `enforcement` are installed (`TENANT_MODES`, default both).
fn installs(enforcement: &str) -> bool {
    std::env::var("TENANT_MODES").map_or(true, |modes| {
        modes
            .split(',')
            .any(|m| m.trim().eq_ignore_ascii_case(enforcement))
    })
}

/// One step's phases.
struct Step {
    tenants: usize,
    none: Phase,
    auto: Phase,
    webhook: Phase,
}

/// Runs the tenants block: Gatehouse, the namespaces, the steps, the table.
pub async fn run(count: usize, rounds: usize, concurrency: usize) -> anyhow::Result<()> {
    let cluster = cluster().await;
    let client = cluster.client().await?;
    let Alone {
        home,
        quiet,
        gh,
        procs,
    } = Alone::start(cluster).await?;
    let steps: Vec<usize> = std::env::var("TENANTS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 16, 64, 256]);
    let mut tenants: Vec<Tenant> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut enforced: Vec<(String, &'static str)> = Vec::new();
    let mut results: Vec<Step> = Vec::new();
    for n in steps {
        while tenants.len() < n {
            let batch = NAMESPACE_BATCH.min(n - tenants.len());
            let created = futures::future::try_join_all((0..batch).map(|_| async {
                Ok::<_, anyhow::Error>(Tenant {
                    auto: TestNamespace::new(cluster, "bench-tenant-auto").await?,
                    webhook: TestNamespace::new(cluster, "bench-tenant-hook").await?,
                })
            }))
            .await?;
            let mut docs = String::new();
            for (k, tenant) in created.iter().enumerate() {
                let i = tenants.len() + k;
                // Past the cap of generated admission policies, Auto keeps the later tenants
                // (by name) on the webhook: two generated policies a tenant.
                let auto = if 2 * (i + 1) <= DEFAULT_MAX_ADMISSION_POLICIES {
                    "InProcess"
                } else {
                    "Webhook"
                };
                for (ns, enforcement, placed) in [
                    (tenant.auto.name(), "Auto", auto),
                    (tenant.webhook.name(), "Webhook", "Webhook"),
                ]
                .into_iter()
                .filter(|(_, enforcement, _)| installs(enforcement))
                {
                    let (d, pair) = tenant_policies(i, ns, enforcement)?;
                    docs.push_str(&d);
                    enforced.extend(pair.iter().map(|p| (p.clone(), placed)));
                    names.extend(pair);
                }
            }
            cluster
                .kubectl_ok(["apply", "-f", "-"], Some(&docs))
                .await?;
            tenants.extend(created);
        }
        await_enforced(
            cluster,
            "the tenants' Policies enforced",
            &enforced,
            Duration::from_secs(600),
        )
        .await?;
        let api = |ns: &TestNamespace| Api::<Pod>::namespaced(client.clone(), ns.name());
        let (api_none, api_auto, api_webhook) =
            (api(&quiet), api(&tenants[0].auto), api(&tenants[0].webhook));
        let installed: Vec<&Api<Pod>> = [("Auto", &api_auto), ("Webhook", &api_webhook)]
            .into_iter()
            .filter(|(mode, _)| installs(mode))
            .map(|(_, api)| api)
            .collect();
        await_in_effect(&installed).await?;
        let load = |api, servers, entries| Load {
            api,
            client: &client,
            procs: &procs,
            servers,
            entries,
            count,
            concurrency,
        };
        let none = load(&api_none, Servers::None, None);
        let auto = load(&api_auto, Servers::Gatehouse(&gh), None);
        let webhook = load(&api_webhook, Servers::Gatehouse(&gh), Some(ENTRY_SUFFIX));
        none.warm("warm").await?;
        for (mode, l) in [("Auto", &auto), ("Webhook", &webhook)] {
            if installs(mode) {
                l.warm("warm").await?;
            }
        }
        let mut step = Step {
            tenants: n,
            none: Phase::default(),
            auto: Phase::default(),
            webhook: Phase::default(),
        };
        for round in 0..rounds {
            eprintln!("==> {n} tenants: round {}/{rounds}", round + 1);
            step.none.extend(none.measure("none", 1).await?);
            if installs("Auto") {
                step.auto.extend(auto.measure("auto", 1).await?);
            }
            if installs("Webhook") {
                step.webhook.extend(webhook.measure("hook", 1).await?);
            }
        }
        results.push(step);
    }
    report(&results, &procs, count, concurrency, rounds);

    // NamespacedPolicies go with their namespaces.
    if !namespaced() {
        let mut delete = vec!["delete", "policies", "--wait=false"];
        delete.extend(names.iter().map(String::as_str));
        cluster.kubectl_ok(delete, None).await?;
    }
    gh.shutdown().await?;
    for tenant in tenants {
        tenant.auto.cleanup().await?;
        tenant.webhook.cleanup().await?;
    }
    quiet.cleanup().await?;
    home.cleanup().await?;
    if results.iter().any(|s| s.none.rounds.is_empty()) {
        bail!("no samples");
    }
    Ok(())
}

fn report(
    steps: &[Step],
    procs: &[(String, u32)],
    count: usize,
    concurrency: usize,
    rounds: usize,
) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    let ratio = |a: &Phase, b: &Phase| a.p99().as_secs_f64() / b.p99().as_secs_f64();
    println!(
        "Tenants: {count} Pod creates in tenant 0's namespace at concurrency {concurrency}; with each number of tenants the three phases take turns for {rounds} rounds; figures: the median over the rounds"
    );
    println!(
        "| tenants | none p99 | Auto p99 | Webhook p99 | Auto / none | Webhook / none | p99 of each round, Auto (ms) | Webhook (ms) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for s in steps {
        println!(
            "| {} | {} | {} | {} | {:.2}x | {:.2}x | {} | {} |",
            s.tenants,
            ms(s.none.p99()),
            ms(s.auto.p99()),
            ms(s.webhook.p99()),
            ratio(&s.auto, &s.none),
            ratio(&s.webhook, &s.none),
            s.auto.p99s(),
            s.webhook.p99s(),
        );
    }
    println!("CPU seconds per round of {count} creates:");
    for s in steps {
        for (i, (name, _)) in procs.iter().enumerate() {
            println!(
                "  {} tenants, {:<16} none {:.2} s, Auto {:.2} s, Webhook {:.2} s",
                s.tenants,
                name,
                s.none.cpu_per_round(i),
                s.auto.cpu_per_round(i),
                s.webhook.cpu_per_round(i),
            );
        }
    }
    if let (Some(first), Some(last)) = (steps.first(), steps.last()) {
        println!(
            "goals: p99({0}) / p99({1}) under Auto = {2:.2}x (<= 1.15; {3:.2}x with each against none beside it); under Webhook = {4:.2}x (<= 1.15; {5:.2}x against none)",
            last.tenants,
            first.tenants,
            ratio(&last.auto, &first.auto),
            ratio(&last.auto, &last.none) / ratio(&first.auto, &first.none),
            ratio(&last.webhook, &first.webhook),
            ratio(&last.webhook, &last.none) / ratio(&first.webhook, &first.none),
        );
    }
}
