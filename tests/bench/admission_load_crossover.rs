//! The crossover block of the admission-load benchmark (`BLOCK=crossover`): how many mutations
//! of a generated MutatingAdmissionPolicy a request may pay before one call of Gatehouse's
//! webhook costs it less. For k = 1..=`CROSSOVER_MAX` (default 4) mutating Policies of one
//! scope (one mutation each, each with a match condition of its own so that none are joined),
//! a namespace where they run in-process (`enforcement: InProcess`:
//! one generated policy of k mutations) and one where they run on the webhook; every phase and
//! no webhooks take turns, round by round. `Auto` keeps a group on the webhook past the largest
//! k whose in-process p99 is below the webhook's.

use super::*;

/// The k mutating Policies for `ns` under `enforcement`.
fn scope_policies(k: usize, ns: &str, enforcement: &str) -> anyhow::Result<(String, Vec<String>)> {
    let tag = enforcement.to_lowercase();
    let mut docs = String::new();
    let mut names = Vec::new();
    for j in 0..k {
        let name = format!("bench-x{k}-{tag}-{j}");
        let mut p = policy(
            &name,
            ns,
            json!({
                "enforcement": enforcement,
                "mutate": [
                    {"merge": {"metadata": {"labels": {format!("bench-x{j}"): "yes"}}}},
                    {"forEach": "spec.containers", "merge": {"securityContext": {"capabilities": {"drop": ["BPF"]}}}}
                ],
            }),
        );
        // A match of its own (a condition that always holds), so that the k mutations are not
        // joined into one.
        p["spec"]["match"]["conditions"] =
            json!([{"name": format!("own-{j}"), "expression": "true"}]);
        docs.push_str(&format!("---\n{}\n", serde_json::to_string(&p)?));
        names.push(name);
    }
    Ok((docs, names))
}

/// Runs the crossover block.
pub async fn run(count: usize, rounds: usize, concurrency: usize) -> anyhow::Result<()> {
    let cluster = cluster().await;
    let client = cluster.client().await?;
    let Alone {
        home,
        quiet,
        gh,
        procs,
    } = Alone::start(cluster).await?;
    let max = env_usize("CROSSOVER_MAX", 4).max(1);
    let mut namespaces: Vec<(TestNamespace, TestNamespace)> = Vec::new();
    let mut docs = String::new();
    let mut names: Vec<String> = Vec::new();
    let mut want: Vec<(String, &str)> = Vec::new();
    for k in 1..=max {
        let in_process = TestNamespace::new(cluster, "bench-x-inproc").await?;
        let webhook = TestNamespace::new(cluster, "bench-x-hook").await?;
        for (ns, enforcement, placed) in [
            (&in_process, "InProcess", "InProcess"),
            (&webhook, "Webhook", "Webhook"),
        ] {
            let (d, these) = scope_policies(k, ns.name(), enforcement)?;
            docs.push_str(&d);
            want.extend(these.iter().map(|n| (n.clone(), placed)));
            names.extend(these);
        }
        namespaces.push((in_process, webhook));
    }
    cluster
        .kubectl_ok(["apply", "-f", "-"], Some(&docs))
        .await?;
    await_enforced(
        cluster,
        "the Policies enforced",
        &want,
        Duration::from_secs(300),
    )
    .await?;
    let api = |ns: &TestNamespace| Api::<Pod>::namespaced(client.clone(), ns.name());
    let api_none = api(&quiet);
    let apis: Vec<(Api<Pod>, Api<Pod>)> =
        namespaces.iter().map(|(i, w)| (api(i), api(w))).collect();
    let probe = pod("probe")?;
    await_condition(
        "the mutations in effect",
        Duration::from_secs(120),
        || async {
            let dry_run = PostParams {
                dry_run: true,
                ..Default::default()
            };
            for (k, (a, b)) in apis.iter().enumerate() {
                for api in [a, b] {
                    let labels = api.create(&dry_run, &probe).await?.metadata.labels;
                    if !labels
                        .is_some_and(|l| (0..=k).all(|j| l.contains_key(&format!("bench-x{j}"))))
                    {
                        return Ok(None);
                    }
                }
            }
            Ok(Some(()))
        },
    )
    .await?;
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
    let loads: Vec<(Load<'_>, Load<'_>)> = apis
        .iter()
        .map(|(a, b)| {
            (
                load(a, Servers::None, None),
                load(b, Servers::Gatehouse(&gh), Some(ENTRY_SUFFIX)),
            )
        })
        .collect();
    none.warm("warm").await?;
    for (a, b) in &loads {
        a.warm("warm").await?;
        b.warm("warm").await?;
    }
    let mut phase_none = Phase::default();
    let mut phases: Vec<(Phase, Phase)> = loads.iter().map(|_| Default::default()).collect();
    for round in 0..rounds {
        eprintln!("==> crossover: round {}/{rounds}", round + 1);
        phase_none.extend(none.measure("none", 1).await?);
        for ((a, b), (pa, pb)) in loads.iter().zip(phases.iter_mut()) {
            pa.extend(a.measure("inproc", 1).await?);
            pb.extend(b.measure("hook", 1).await?);
        }
    }
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    let ratio = |a: &Phase| a.p99().as_secs_f64() / phase_none.p99().as_secs_f64();
    println!(
        "Crossover: {count} Pod creates at concurrency {concurrency}, {rounds} rounds taking turns; no webhooks p99 {} ({})",
        ms(phase_none.p99()),
        phase_none.p99s()
    );
    println!(
        "| mutating Policies (one mutation each) | in-process p99 | / none | webhook p99 | / none | in-process / webhook | API server CPU-s per round, in-process / webhook |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    let mut crossover = 0;
    for (k, (a, b)) in phases.iter().enumerate() {
        let cheaper = a.p99() <= b.p99();
        if cheaper && crossover == k {
            crossover = k + 1;
        }
        println!(
            "| {} | {} | {:.2}x | {} | {:.2}x | {:.2}x | {:.2} / {:.2} |",
            k + 1,
            ms(a.p99()),
            ratio(a),
            ms(b.p99()),
            ratio(b),
            a.p99().as_secs_f64() / b.p99().as_secs_f64(),
            a.cpu_per_round(0),
            b.cpu_per_round(0),
        );
    }
    println!("crossover: in-process is the cheaper choice up to {crossover} mutations per request");

    let mut delete = vec!["delete", "policies", "--wait=false"];
    delete.extend(names.iter().map(String::as_str));
    cluster.kubectl_ok(delete, None).await?;
    gh.shutdown().await?;
    for (a, b) in namespaces {
        a.cleanup().await?;
        b.cleanup().await?;
    }
    quiet.cleanup().await?;
    home.cleanup().await?;
    Ok(())
}
