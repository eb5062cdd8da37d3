//! CPU seconds of the control plane and Gatehouse, for the benchmarks' reports.

/// CPU seconds (user + system) a process has used so far, from /proc/<pid>/stat; for a thread
/// of this process other than its first (a test webhook's), that thread's alone, which only
/// /proc/self/task/<tid>/stat gives (/proc/<tid>/stat counts the whole process).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let thread = format!("/proc/self/task/{pid}/stat");
    let path = if pid != std::process::id() && std::path::Path::new(&thread).exists() {
        thread
    } else {
        format!("/proc/{pid}/stat")
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// PIDs whose CPU time the benchmark reports: the control plane (from its pid files) and
/// Gatehouse.
pub fn processes(state_dir: &std::path::Path, gatehouse: Option<u32>) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = ["kube-apiserver", "etcd"]
        .iter()
        .filter_map(|name| {
            let pid = std::fs::read_to_string(state_dir.join(format!("{name}.pid"))).ok()?;
            Some((name.to_string(), pid.trim().parse().ok()?))
        })
        .collect();
    if let Some(pid) = gatehouse {
        out.push(("gatehouse".into(), pid));
    }
    out
}

pub fn cpu_snapshot(procs: &[(String, u32)]) -> Vec<f64> {
    procs
        .iter()
        .map(|(_, pid)| cpu_seconds(*pid).unwrap_or(0.0))
        .collect()
}
