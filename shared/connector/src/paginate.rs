//! Following `next` links. NetBox and Ironic both return an absolute `next`
//! URL built from the host they believe they are on, which behind a proxy is
//! often not the one we called; the link is rebased onto the configured
//! origin. A link seen twice, or a read that never ends, fails the poll.

use std::collections::HashSet;
use std::future::Future;

use reqwest::Url;

use crate::error::SourceError;

/// Parses a configured base URL, naming the configuration key on error.
pub fn base_url(key: &str, url: &str) -> Result<Url, SourceError> {
    let u = Url::parse(url.trim())
        .map_err(|e| SourceError::Config(format!("configuration key {key}: {url:?}: {e}")))?;
    if !matches!(u.scheme(), "http" | "https") {
        return Err(SourceError::Config(format!(
            "configuration key {key}: {url:?} is not an http(s) URL"
        )));
    }
    Ok(u)
}

/// [`base_url`] of a key that must be set: empty (or blank) is
/// `configuration key <key> is required`.
pub fn required_base_url(key: &str, url: &str) -> Result<Url, SourceError> {
    if url.trim().is_empty() {
        return Err(SourceError::Config(format!(
            "configuration key {key} is required"
        )));
    }
    base_url(key, url)
}

/// `url` with `segments` appended, each path-escaped (a `/` in one is
/// `%2F`); the error, for a URL that cannot be a base, names `shown`.
pub fn with_segments(mut url: Url, segments: &[&str], shown: &Url) -> Result<Url, SourceError> {
    url.path_segments_mut()
        .map_err(|_| SourceError::Config(format!("{shown} cannot be a base URL")))?
        .extend(segments);
    Ok(url)
}

/// `base` joined with `path`, keeping any path prefix of `base`
/// (`https://h/netbox` + `api/dcim/devices/` = `https://h/netbox/api/dcim/devices/`).
pub fn join(base: &Url, path: &str) -> Url {
    let mut u = base.clone();
    let prefix = u.path().trim_end_matches('/').to_string();
    u.set_path(&format!("{prefix}/{}", path.trim_start_matches('/')));
    u.set_query(None);
    u
}

/// Walks the `next` links of one paginated read.
#[derive(Debug)]
pub struct Pages {
    origin: Url,
    seen: HashSet<String>,
    max_pages: u32,
    fetched: u32,
}

impl Pages {
    /// `first` is the first page's URL; its origin is the one every `next`
    /// link is rebased onto.
    pub fn new(first: &Url, max_pages: u32) -> Self {
        let mut seen = HashSet::new();
        seen.insert(first.to_string());
        Pages {
            origin: first.clone(),
            seen,
            max_pages: max_pages.max(1),
            fetched: 1,
        }
    }

    /// The URL of the next page, or `None` at the end. `next` may be
    /// absolute or relative; an empty string or JSON null ends the read.
    pub fn next(&mut self, next: Option<&str>) -> Result<Option<Url>, SourceError> {
        let Some(next) = next.map(str::trim).filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        let mut url = self
            .origin
            .join(next)
            .map_err(|e| SourceError::Protocol(format!("next link {next:?} is not a URL: {e}")))?;
        if url.origin() != self.origin.origin() {
            // The server names itself differently from how we reach it.
            let _ = url.set_scheme(self.origin.scheme());
            let _ = url.set_host(self.origin.host_str());
            let _ = url.set_port(self.origin.port());
        }
        if !self.seen.insert(url.to_string()) {
            return Err(SourceError::Protocol(format!(
                "pagination loop: {url} was already read in this poll"
            )));
        }
        self.fetched += 1;
        if self.fetched > self.max_pages {
            return Err(SourceError::Protocol(format!(
                "more than {} pages from {}; raise poll.max_pages if the source is that large",
                self.max_pages,
                self.origin.path()
            )));
        }
        Ok(Some(url))
    }
}

/// Reads every page: `fetch` returns one page's items and its `next` link.
pub async fn collect_pages<T, F, Fut>(
    first: Url,
    max_pages: u32,
    mut fetch: F,
) -> Result<Vec<T>, SourceError>
where
    F: FnMut(Url) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), SourceError>>,
{
    let mut pages = Pages::new(&first, max_pages);
    let mut out = Vec::new();
    let mut url = first;
    loop {
        let (items, next) = fetch(url).await?;
        out.extend(items);
        match pages.next(next.as_deref())? {
            Some(u) => url = u,
            None => return Ok(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_links_are_rebased_onto_the_configured_origin() {
        let first = Url::parse("https://netbox.example.com/api/dcim/devices/?site=dc1").unwrap();
        let mut p = Pages::new(&first, 10);
        let n = p
            .next(Some(
                "http://127.0.0.1:8000/api/dcim/devices/?limit=50&offset=50&site=dc1",
            ))
            .unwrap()
            .unwrap();
        assert_eq!(
            n.as_str(),
            "https://netbox.example.com/api/dcim/devices/?limit=50&offset=50&site=dc1"
        );
        // Relative links resolve against the first page.
        let r = p.next(Some("/v1/nodes?marker=abc")).unwrap().unwrap();
        assert_eq!(r.as_str(), "https://netbox.example.com/v1/nodes?marker=abc");
        assert_eq!(p.next(None).unwrap(), None);
        assert_eq!(p.next(Some("")).unwrap(), None);
    }

    #[test]
    fn loops_and_endless_reads_fail() {
        let first = Url::parse("http://h/v1/nodes?detail=true").unwrap();
        let mut p = Pages::new(&first, 10);
        assert!(matches!(
            p.next(Some("http://h/v1/nodes?detail=true")),
            Err(SourceError::Protocol(_))
        ));
        let mut p = Pages::new(&first, 2);
        assert!(p
            .next(Some("http://h/v1/nodes?marker=1"))
            .unwrap()
            .is_some());
        let err = p.next(Some("http://h/v1/nodes?marker=2")).unwrap_err();
        assert!(err.to_string().contains("more than 2 pages"), "{err}");
    }

    #[test]
    fn join_keeps_a_path_prefix() {
        let b = Url::parse("https://h/netbox/").unwrap();
        assert_eq!(
            join(&b, "/api/dcim/devices/").as_str(),
            "https://h/netbox/api/dcim/devices/"
        );
        let b = Url::parse("http://h:6385").unwrap();
        assert_eq!(join(&b, "v1/nodes").as_str(), "http://h:6385/v1/nodes");
        assert!(base_url("k", "ftp://x").is_err());
        assert!(base_url("k", "not a url")
            .unwrap_err()
            .to_string()
            .contains("configuration key k"));
        assert_eq!(
            required_base_url("k", " ").unwrap_err().to_string(),
            "configuration key k is required"
        );
        assert!(required_base_url("k", "ftp://x").is_err());
        let nodes = Url::parse("http://h/v1/nodes").unwrap();
        assert_eq!(
            with_segments(nodes.clone(), &["gpu/1", "traits"], &nodes)
                .unwrap()
                .as_str(),
            "http://h/v1/nodes/gpu%2F1/traits"
        );
        let mail = Url::parse("mailto:x@h").unwrap();
        assert_eq!(
            with_segments(mail.clone(), &["a"], &nodes)
                .unwrap_err()
                .to_string(),
            "http://h/v1/nodes cannot be a base URL"
        );
    }

    #[tokio::test]
    async fn collect_pages_reads_until_the_end() {
        let first = Url::parse("http://h/items").unwrap();
        let items = collect_pages(first, 10, |u: Url| async move {
            let page: u32 = u
                .query_pairs()
                .find(|(k, _)| k == "page")
                .map(|(_, v)| v.parse().unwrap())
                .unwrap_or(0);
            let next = (page < 2).then(|| format!("/items?page={}", page + 1));
            Ok((vec![page], next))
        })
        .await
        .unwrap();
        assert_eq!(items, vec![0, 1, 2]);
    }
}
