//! The one dead-letter path: copy a message to `DLQ` with its reason, then
//! terminate it. The copy always fits the server's max payload: a payload
//! (or headers) too large is cut, and the copy names the original's stream
//! and sequence and size, so an operator can still find it. When the copy
//! cannot be stored the message is left for redelivery: nothing is lost.

use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use async_nats::HeaderMap;
use bytes::Bytes;

use crate::{Subjects, HEADER_DLQ_ERROR, HEADER_DLQ_REASON, HEADER_DLQ_SUBJECT};

/// `<stream> <sequence>` of the original message.
pub const HEADER_DLQ_ORIGIN: &str = "Fleet-Dlq-Origin";
/// The original payload's size in bytes, set when the copy was cut.
pub const HEADER_DLQ_TRUNCATED: &str = "Fleet-Dlq-Truncated";

/// The longest error text a copy carries.
const MAX_ERROR: usize = 1024;
/// Room kept for the protocol line, the message id and header framing.
const SLACK: usize = 2048;

/// The headers and payload of a dead-letter copy that fits `max_payload`.
pub fn copy(
    original: Option<&HeaderMap>,
    subject: &str,
    origin: &str,
    payload: &Bytes,
    reason: &str,
    error: &str,
    max_payload: usize,
) -> (HeaderMap, Bytes) {
    let error: String = error
        .replace(['\r', '\n'], " ")
        .chars()
        .take(MAX_ERROR)
        .collect();
    let subject: String = subject.chars().take(MAX_ERROR).collect();
    let mut h = HeaderMap::new();
    let mut size = 0;
    let mut put = |h: &mut HeaderMap, k: &str, v: &str| {
        size += k.len() + v.len() + 4;
        h.insert(k, v);
    };
    put(&mut h, HEADER_DLQ_REASON, reason);
    put(&mut h, HEADER_DLQ_ERROR, &error);
    put(&mut h, HEADER_DLQ_SUBJECT, &subject);
    put(&mut h, HEADER_DLQ_ORIGIN, origin);
    let budget = max_payload.saturating_sub(SLACK);
    // The original's own headers (trace, schema) when they fit in half.
    if let Some(orig) = original {
        let theirs = headers_size(orig);
        if size + theirs <= budget / 2 {
            for (k, vs) in orig.iter() {
                if AsRef::<str>::as_ref(k).eq_ignore_ascii_case("Nats-Msg-Id") {
                    continue;
                }
                for v in vs {
                    h.append(AsRef::<str>::as_ref(k), v.as_str());
                }
            }
            size += theirs;
        }
    }
    let room = budget.saturating_sub(size);
    if payload.len() <= room {
        return (h, payload.clone());
    }
    h.insert(HEADER_DLQ_TRUNCATED, payload.len().to_string().as_str());
    (h, payload.slice(..room))
}

/// The bytes `h` takes on the wire: each value with its name and framing.
fn headers_size(h: &HeaderMap) -> usize {
    h.iter()
        .map(|(k, vs)| {
            vs.iter()
                .map(|v| AsRef::<str>::as_ref(k).len() + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum()
}

/// Copies `msg` to `<root>.dlq.<stream>.<reason>` and terminates it; true
/// when the copy is stored. Otherwise the message is nak'd for redelivery.
pub async fn dead_letter(
    js: &jetstream::Context,
    subjects: &Subjects,
    stream: &str,
    msg: &jetstream::Message,
    reason: &str,
    error: &str,
) -> bool {
    let (origin, id) = match msg.info() {
        Ok(i) => (
            format!("{} {}", i.stream, i.stream_sequence),
            format!("dlq-{}-{}", i.stream, i.stream_sequence),
        ),
        Err(_) => {
            let id = format!("dlq-{}", ulid_like());
            (String::from("-"), id)
        }
    };
    // 0 before the first INFO: assume the server default (1 MiB).
    let max_payload = match js.client().server_info().max_payload {
        0 => 1 << 20,
        n => n,
    };
    let (headers, payload) = copy(
        msg.headers.as_ref(),
        msg.subject.as_str(),
        &origin,
        &msg.payload,
        reason,
        error,
        max_payload,
    );
    let subject = subjects.dlq(stream, reason);
    match crate::publish_acked(js, subject, &id, headers, payload).await {
        Ok(()) => {
            tracing::warn!(subject = %msg.subject, reason, error, "dead-lettered");
            let _ = msg.ack_with(AckKind::Term).await;
            true
        }
        Err(e) => {
            tracing::error!(subject = %msg.subject, error = %e, "could not dead-letter; leaving for redelivery");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                .await;
            false
        }
    }
}

fn ulid_like() -> String {
    use rand::Rng;
    format!("{:032x}", rand::thread_rng().gen::<u128>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_of_a_message_near_the_limit_fits_and_says_it_was_cut() {
        let payload = Bytes::from(vec![b'x'; 1_048_000]);
        let mut orig = HeaderMap::new();
        orig.insert("Fleet-Schema", "fleet.v1.ConditionSnapshot");
        orig.insert("Nats-Msg-Id", "m1");
        let (h, p) = copy(
            Some(&orig),
            "fleet.obs.slurm.0.x",
            "OBSERVATIONS 7",
            &payload,
            "invalid",
            "too big",
            1 << 20,
        );
        let headers = headers_size(&h);
        assert!(p.len() + headers + 200 < 1 << 20, "{} + {headers}", p.len());
        assert_eq!(
            h.get(HEADER_DLQ_TRUNCATED).map(|v| v.as_str()),
            Some("1048000")
        );
        assert_eq!(
            h.get(HEADER_DLQ_ORIGIN).map(|v| v.as_str()),
            Some("OBSERVATIONS 7")
        );
        assert_eq!(
            h.get("Fleet-Schema").map(|v| v.as_str()),
            Some("fleet.v1.ConditionSnapshot")
        );
        assert!(h.get("Nats-Msg-Id").is_none());
    }

    #[test]
    fn a_small_message_is_copied_whole() {
        let payload = Bytes::from_static(b"abc");
        let (h, p) = copy(
            None,
            "s",
            "O 1",
            &payload,
            "invalid",
            "line\\nbreak",
            1 << 20,
        );
        assert_eq!(p, payload);
        assert!(h.get(HEADER_DLQ_TRUNCATED).is_none());
    }

    #[test]
    fn huge_original_headers_are_left_out() {
        let mut orig = HeaderMap::new();
        orig.insert("X-Big", "y".repeat(900_000).as_str());
        let payload = Bytes::from(vec![b'x'; 100_000]);
        let (h, p) = copy(Some(&orig), "s", "O 1", &payload, "r", "e", 1 << 20);
        assert!(h.get("X-Big").is_none());
        assert_eq!(p.len(), 100_000);
    }
}
