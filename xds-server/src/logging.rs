//! Log output of the instance: text, or JSON with one object per line. In JSON every line carries
//! the instance's `tenant` and `revision` (spliced into each object: tokio tasks and tonic's
//! connection tasks do not inherit a span, so a span could not put them on every line), and the
//! ADS stream events add `proxy`.

use std::fmt::Write as _;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Wraps an event formatter that writes one JSON object per event and adds fixed fields first.
pub struct WithFields<F> {
    inner: F,
    /// `"k":"v",` pairs, JSON-escaped.
    prefix: String,
}

impl<F> WithFields<F> {
    pub fn new<'a>(inner: F, fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        let mut prefix = String::new();
        for (k, v) in fields {
            let k = serde_json::Value::from(k).to_string();
            let v = serde_json::Value::from(v).to_string();
            let _ = write!(prefix, "{k}:{v},");
        }
        WithFields { inner, prefix }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithFields<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => {
                writer.write_char('{')?;
                writer.write_str(&self.prefix)?;
                writer.write_str(rest)
            }
            None => writer.write_str(&line),
        }
    }
}

/// The log format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the process's subscriber (`RUST_LOG` filters, default `info`).
pub fn init(format: LogFormat, tenant: &str, revision: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    match format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => {
            let json = tracing_subscriber::fmt::format()
                .json()
                .with_current_span(true);
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .fmt_fields(JsonFields::new())
                .event_format(WithFields::new(
                    json,
                    [("tenant", tenant), ("revision", revision)],
                ))
                .init()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_json_line_carries_tenant_and_revision() {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(JsonFields::new())
            .event_format(WithFields::new(
                tracing_subscriber::fmt::format().json(),
                [("tenant", "blue"), ("revision", "blue-\"v1\"")],
            ))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                proxy = "sidecar~198.18.0.7~web.shop~shop.svc.cluster.local",
                "stream opened"
            );
            tracing::warn!("no fields");
        });
        let text = String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        for line in &lines {
            assert_eq!(line["tenant"], "blue");
            assert_eq!(line["revision"], "blue-\"v1\"");
        }
        assert_eq!(
            lines[0]["fields"]["proxy"],
            "sidecar~198.18.0.7~web.shop~shop.svc.cluster.local"
        );
        assert_eq!(lines[1]["level"], "WARN");
    }
}
