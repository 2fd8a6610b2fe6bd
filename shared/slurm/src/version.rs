//! Which slurmrestd API version to read: configured, or detected from the
//! OpenAPI document (`/openapi/v3`), or by probing `/slurm/v0.0.<n>/ping`
//! from the newest version this connector knows down to the oldest.

use std::fmt;

/// `v0.0.<minor>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiVersion(pub u32);

/// Probed newest first when `/openapi/v3` does not say.
pub const PROBE_ORDER: [ApiVersion; 7] = [
    ApiVersion(42),
    ApiVersion(41),
    ApiVersion(40),
    ApiVersion(39),
    ApiVersion(38),
    ApiVersion(37),
    ApiVersion(36),
];

impl ApiVersion {
    /// Parses `v0.0.38` or `0.0.38`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        t.strip_prefix("0.0.")
            .and_then(|m| m.parse::<u32>().ok())
            .map(ApiVersion)
            .ok_or_else(|| format!("{s:?} is not a slurmrestd version like v0.0.38"))
    }

    pub fn nodes_path(self) -> String {
        format!("slurm/{self}/nodes")
    }

    pub fn ping_path(self) -> String {
        format!("slurm/{self}/ping")
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v0.0.{}", self.0)
    }
}

/// The newest version whose `/slurm/v0.0.<n>/nodes` path the OpenAPI
/// document lists.
pub fn from_openapi(doc: &serde_json::Value) -> Option<ApiVersion> {
    doc.get("paths")?
        .as_object()?
        .keys()
        .filter_map(|p| {
            let rest = p.strip_prefix("/slurm/v0.0.")?;
            let (minor, tail) = rest.split_once('/')?;
            (tail.trim_end_matches('/') == "nodes")
                .then(|| minor.parse::<u32>().ok())
                .flatten()
        })
        .max()
        .map(ApiVersion)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_paths() {
        assert_eq!(ApiVersion::parse("v0.0.38"), Ok(ApiVersion(38)));
        assert_eq!(ApiVersion::parse("0.0.40"), Ok(ApiVersion(40)));
        assert!(ApiVersion::parse("v0.1.0").is_err());
        assert!(ApiVersion::parse("38").is_err());
        assert_eq!(ApiVersion(38).nodes_path(), "slurm/v0.0.38/nodes");
        assert_eq!(ApiVersion(41).ping_path(), "slurm/v0.0.41/ping");
    }

    #[test]
    fn openapi_picks_the_newest_nodes_path() {
        // The paths slurmrestd 22.05 lists with the v0.0.36..38 plugins.
        let doc = serde_json::json!({"paths": {
            "/slurm/v0.0.36/nodes": {}, "/slurm/v0.0.37/nodes": {}, "/slurm/v0.0.38/nodes": {},
            "/slurm/v0.0.38/node/{node_name}": {}, "/slurm/v0.0.39/diag": {},
            "/slurmdb/v0.0.40/nodes": {}
        }});
        assert_eq!(from_openapi(&doc), Some(ApiVersion(38)));
        let doc =
            serde_json::json!({"paths": {"/slurm/v0.0.40/nodes/": {}, "/slurm/v0.0.41/nodes": {}}});
        assert_eq!(from_openapi(&doc), Some(ApiVersion(41)));
        assert_eq!(from_openapi(&serde_json::json!({"paths": {}})), None);
        assert_eq!(from_openapi(&serde_json::json!({"openapi": "3.0"})), None);
    }
}
