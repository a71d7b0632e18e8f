//! What this test process logs, kept for the test to read: the lines an
//! in-process agent writes, as its pod's log would show them. Info and
//! above, printed to the test output as well.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

type Lines = Arc<Mutex<Vec<String>>>;

static LINES: OnceLock<Lines> = OnceLock::new();

/// The lines logged in this process since [`capture`] was first called.
#[derive(Clone)]
pub struct Captured(Lines);

impl Captured {
    /// The lines that contain every one of `needles`.
    pub fn matching(&self, needles: &[&str]) -> Vec<String> {
        self.0
            .lock()
            .expect("never poisoned")
            .iter()
            .filter(|l| needles.iter().all(|n| l.contains(n)))
            .cloned()
            .collect()
    }
}

/// Makes the capture this process's tracing subscriber, instead of
/// `testenv::init_tracing` (call it first).
pub fn capture() -> Captured {
    let lines = LINES
        .get_or_init(|| {
            let lines = Lines::default();
            tracing::subscriber::set_global_default(Capture {
                lines: lines.clone(),
                spans: AtomicU64::new(1),
            })
            .expect("no subscriber was set before");
            lines
        })
        .clone();
    Captured(lines)
}

struct Capture {
    lines: Lines,
    spans: AtomicU64,
}

/// `message k=v k=v`, as the fmt subscriber writes an event.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for Capture {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::INFO)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(self.spans.fetch_add(1, Ordering::Relaxed))
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut line = Line::default();
        event.record(&mut line);
        let meta = event.metadata();
        let text = format!(
            "{} {} {}: {}{}",
            utc_now(),
            meta.level(),
            meta.target(),
            line.message,
            line.fields
        );
        eprintln!("{text}");
        self.lines.lock().expect("never poisoned").push(text);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// The time of day, UTC, as the binaries' logs write it (`03:42:28.763`).
pub fn utc_now() -> String {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let s = since.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        since.subsec_millis()
    )
}
