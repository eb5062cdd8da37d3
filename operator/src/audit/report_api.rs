//! Which report API a pass writes in (`--report-api`): one named, or `auto`, whichever the API
//! server serves (openreports.io, the newer, when both are). Asked of discovery every pass, so
//! CRDs installed or removed later are followed without a restart.
use kube::Client;

use gatehouse_api::reports::{ReportApi, ReportKind};

/// `--report-api`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReportApiChoice {
    /// wgpolicyk8s.io/v1alpha2 PolicyReport and ClusterPolicyReport.
    Wgpolicyk8s,
    /// openreports.io/v1alpha1 Report and ClusterReport.
    Openreports,
    /// Whichever the API server serves; openreports.io when it serves both (and
    /// wgpolicyk8s.io, whose writes then fail saying so, when it serves neither).
    #[default]
    Auto,
}

/// Which report APIs the API server serves, both kinds of each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub wgpolicyk8s: bool,
    pub openreports: bool,
}

impl Served {
    pub fn serves(self, api: ReportApi) -> bool {
        match api {
            ReportApi::Wgpolicyk8s => self.wgpolicyk8s,
            ReportApi::Openreports => self.openreports,
        }
    }
}

/// The API a pass writes in: pure.
pub fn chosen(choice: ReportApiChoice, served: Served) -> ReportApi {
    match choice {
        ReportApiChoice::Wgpolicyk8s => ReportApi::Wgpolicyk8s,
        ReportApiChoice::Openreports => ReportApi::Openreports,
        ReportApiChoice::Auto if served.openreports => ReportApi::Openreports,
        ReportApiChoice::Auto => ReportApi::Wgpolicyk8s,
    }
}

/// What discovery says is served: an API the API server answers 404 for is not. Any other
/// error fails the pass (retried with backoff): written to the wrong API, reports would move
/// back and forth with every failed lookup.
pub async fn served(client: &Client) -> Result<Served, kube::Error> {
    let mut served = Served::default();
    for api in ReportApi::ALL {
        let both = match client.list_api_group_resources(&api.api_version()).await {
            Ok(list) => [ReportKind::Namespaced, ReportKind::Cluster]
                .iter()
                .all(|k| list.resources.iter().any(|r| r.name == api.plural(*k))),
            Err(kube::Error::Api(status)) if status.code == 404 => false,
            Err(e) => return Err(e),
        };
        match api {
            ReportApi::Wgpolicyk8s => served.wgpolicyk8s = both,
            ReportApi::Openreports => served.openreports = both,
        }
    }
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_the_served_api_and_the_newer_of_two() {
        let served = |wgpolicyk8s, openreports| Served {
            wgpolicyk8s,
            openreports,
        };
        let auto = ReportApiChoice::Auto;
        assert_eq!(chosen(auto, served(false, true)), ReportApi::Openreports);
        assert_eq!(chosen(auto, served(true, false)), ReportApi::Wgpolicyk8s);
        assert_eq!(chosen(auto, served(true, true)), ReportApi::Openreports);
        assert_eq!(chosen(auto, served(false, false)), ReportApi::Wgpolicyk8s);
        // A named API is taken whatever is served.
        let named = ReportApiChoice::Wgpolicyk8s;
        assert_eq!(chosen(named, served(true, true)), ReportApi::Wgpolicyk8s);
        let named = ReportApiChoice::Openreports;
        assert_eq!(chosen(named, served(false, false)), ReportApi::Openreports);
    }
}
