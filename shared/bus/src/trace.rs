//! W3C trace context (`traceparent`) carried in NATS headers, so one trace
//! spans connector -> hub -> consumer.

use rand::Rng;

/// A parsed `traceparent`: version 00, trace id, parent span id, flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: String,
    pub span_id: String,
    pub flags: String,
}

impl TraceParent {
    pub fn parse(s: &str) -> Option<Self> {
        let parts: Vec<&str> = s.trim().split('-').collect();
        let hex = |p: &str, n: usize| {
            p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()) && p.bytes().any(|b| b != b'0')
        };
        match parts.as_slice() {
            ["00", t, s, f] if hex(t, 32) && hex(s, 16) && f.len() == 2 => Some(TraceParent {
                trace_id: t.to_string(),
                span_id: s.to_string(),
                flags: f.to_string(),
            }),
            _ => None,
        }
    }

    /// A new root trace.
    pub fn new_root() -> Self {
        let mut rng = rand::thread_rng();
        TraceParent {
            trace_id: hex::encode(rng.gen::<[u8; 16]>()),
            span_id: hex::encode(rng.gen::<[u8; 8]>()),
            flags: "01".into(),
        }
    }

    /// A child span in the same trace.
    pub fn child(&self) -> Self {
        TraceParent {
            trace_id: self.trace_id.clone(),
            span_id: hex::encode(rand::thread_rng().gen::<[u8; 8]>()),
            flags: self.flags.clone(),
        }
    }

    pub fn header(&self) -> String {
        format!("00-{}-{}-{}", self.trace_id, self.span_id, self.flags)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_child() {
        let tp =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let c = tp.child();
        assert_eq!(c.trace_id, tp.trace_id);
        assert_ne!(c.span_id, tp.span_id);
        assert!(
            TraceParent::parse("00-00000000000000000000000000000000-00f067aa0ba902b7-01").is_none()
        );
        assert!(TraceParent::parse("garbage").is_none());
        assert_eq!(TraceParent::parse(&c.header()), Some(c));
    }
}
