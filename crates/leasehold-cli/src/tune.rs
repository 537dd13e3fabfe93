//! `leasehold tune`: recommend or judge a lease TTL (worked example 3).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use leasehold::tune::{
    Assessment, Conditions, ETCD_EXPIRY_CHECK, RECOMMENDED_LOST_RENEWALS, Verdict,
    store_expiry_check,
};
use serde::Serialize;

use crate::cli::TuneArgs;

/// Exit status when the TTL given with `--ttl` is unsafe.
pub const EXIT_UNSAFE: u8 = 3;
/// TTL asked for the measuring session: long enough that no renewal during
/// the measurement can find it expired.
const MEASURE_TTL: Duration = Duration::from_secs(60);

pub async fn run(args: TuneArgs) -> anyhow::Result<ExitCode> {
    // The conditions known before measuring are checked before the store
    // is contacted.
    if let Some(renew_every) = args.renew_every.or(args.ttl.map(|ttl| ttl / 3)) {
        Conditions::new(renew_every, args.jitter.unwrap_or_default(), args.skew)?;
    }
    let measured = match args.measure {
        Some(n) => Some(measure(&args, n).await?),
        None => None,
    };
    let jitter = jitter(&args, measured.as_ref())?;
    let renew_every = match (args.renew_every, args.ttl) {
        (Some(r), _) => r,
        (None, Some(ttl)) => ttl / 3,
        (None, None) => anyhow::bail!("give --renew-every or --ttl"),
    };
    let expiry_check = args
        .store
        .store
        .as_ref()
        .map_or(Duration::ZERO, store_expiry_check);
    let conditions =
        Conditions::new(renew_every, jitter, args.skew)?.with_store_expiry_check(expiry_check);
    let recommendation = conditions.recommend();
    let evaluated = args.ttl.map(|ttl| conditions.assess(ttl));
    let report = Report {
        renew_every_ms: millis(renew_every),
        jitter_ms: millis(jitter),
        skew_ms: millis(args.skew),
        store_expiry_check_ms: millis(expiry_check),
        drift: conditions.drift,
        measured: measured.as_ref().map(Measured::json),
        recommended_ttl_ms: millis(recommendation.recommended.ttl),
        recommended_ttl: show(recommendation.recommended.ttl),
        recommended: AssessmentJson::new(&recommendation.recommended),
        alternatives: recommendation
            .alternatives
            .iter()
            .map(AssessmentJson::new)
            .collect(),
        evaluated: evaluated.as_ref().map(AssessmentJson::new),
    };
    let text = if args.json {
        let mut json = serde_json::to_string(&report)?;
        json.push('\n');
        json
    } else {
        human(&report, &conditions, measured.as_ref(), evaluated.as_ref())
    };
    crate::generate::write_stdout(text.as_bytes())?;
    Ok(match evaluated {
        Some(a) if !a.is_safe() => ExitCode::from(EXIT_UNSAFE),
        _ => ExitCode::SUCCESS,
    })
}

/// The jitter to assume: `--jitter`, the measured p99, or the larger of
/// the two. Measured round trips count in whole milliseconds, rounded up,
/// so the JSON's `jitter_ms` is exactly the jitter the figures assume.
fn jitter(args: &TuneArgs, measured: Option<&Measured>) -> anyhow::Result<Duration> {
    Ok(match (args.jitter, measured) {
        (Some(given), Some(m)) => given.max(m.p99),
        (Some(given), None) => given,
        (None, Some(m)) => m.p99,
        (None, None) => anyhow::bail!("give --jitter or --measure N"),
    })
}

/// Round trips of renewals against a real store.
struct Measured {
    store: String,
    samples: Vec<Duration>,
    p50: Duration,
    p99: Duration,
}

impl Measured {
    fn json(&self) -> MeasuredJson {
        MeasuredJson {
            store: self.store.clone(),
            samples: self.samples.len(),
            p50_ms: millis(ceil_ms(self.p50)),
            p99_ms: millis(self.p99),
            max_ms: millis(ceil_ms(self.samples.last().copied().unwrap_or_default())),
        }
    }
}

/// Opens a session and renews it `n` times back to back, timing each.
async fn measure(args: &TuneArgs, n: u32) -> anyhow::Result<Measured> {
    let store = args.store.open().await?;
    let lease = store.open_session(MEASURE_TTL).await?;
    let mut samples = Vec::with_capacity(n as usize);
    let mut outcome = Ok(());
    for _ in 0..n {
        let sent = Instant::now();
        if let Err(error) = store.keep_alive(lease.id).await {
            outcome = Err(error);
            break;
        }
        samples.push(sent.elapsed());
    }
    if let Err(error) = store.close_session(lease.id).await {
        tracing::warn!(%error, "could not close the measuring session; the store expires it");
    }
    outcome?;
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let p99 = ceil_ms(at(0.99));
    Ok(Measured {
        store: args
            .store
            .store
            .as_ref()
            .map_or_else(|| "default sqlite".to_owned(), ToString::to_string),
        p50: at(0.5),
        p99,
        samples,
    })
}

/// `24h`.
fn show_hours(d: Duration) -> String {
    format!("{}h", d.as_secs() / 3600)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` rounded up to whole milliseconds.
fn ceil_ms(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// "1 lost renewal", "2 lost renewals".
fn lost_renewals(n: u32) -> String {
    if n == 1 {
        "1 lost renewal".to_owned()
    } else {
        format!("{n} lost renewals")
    }
}

/// `tune --json`: every `*_ms` field is a whole number of milliseconds.
#[derive(Debug, Serialize)]
struct Report {
    renew_every_ms: u64,
    jitter_ms: u64,
    skew_ms: u64,
    /// How late the store may notice an expiry (etcd: 500), included in
    /// every `worst_case_failover_ms`.
    store_expiry_check_ms: u64,
    drift: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    measured: Option<MeasuredJson>,
    recommended_ttl_ms: u64,
    recommended_ttl: String,
    recommended: AssessmentJson,
    alternatives: Vec<AssessmentJson>,
    #[serde(skip_serializing_if = "Option::is_none")]
    evaluated: Option<AssessmentJson>,
}

#[derive(Debug, Serialize)]
struct MeasuredJson {
    store: String,
    samples: usize,
    /// Rounded up to whole milliseconds.
    p50_ms: u64,
    p99_ms: u64,
    max_ms: u64,
}

#[derive(Debug, Serialize)]
struct AssessmentJson {
    ttl_ms: u64,
    renew_every_ms: u64,
    lost_renewals_absorbed: u32,
    slowest_renewal_absorbed_ms: u64,
    worst_case_failover_ms: u64,
    verdict: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl AssessmentJson {
    fn new(a: &Assessment) -> Self {
        AssessmentJson {
            ttl_ms: millis(a.ttl),
            renew_every_ms: millis(a.renew_every),
            lost_renewals_absorbed: a.lost_renewals_absorbed,
            slowest_renewal_absorbed_ms: millis(a.round_trip_absorbed),
            worst_case_failover_ms: millis(a.worst_case_failover),
            verdict: a.verdict.to_string(),
            reason: match &a.verdict {
                Verdict::Unsafe { reason } => Some(reason.clone()),
                Verdict::Fragile => Some(
                    "one lost or slow renewal ends leadership: false failovers, flapping under load"
                        .into(),
                ),
                Verdict::Tolerant => None,
            },
        }
    }
}

/// `11s`, `2.1s`, `88ms`, `255µs`: the shortest readable form, in the
/// syntax the duration flags accept.
fn show(d: Duration) -> String {
    let trim = |x: f64| {
        let text = format!("{x:.3}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    if d >= Duration::from_secs(1) {
        format!("{}s", trim(d.as_secs_f64()))
    } else if d >= Duration::from_millis(1) {
        format!("{}ms", trim(d.as_secs_f64() * 1e3))
    } else {
        format!("{}µs", d.as_micros())
    }
}

/// The report for people, written into a string first: stdout is written
/// once, by [`write_stdout`], whose failure is an error, never a panic.
/// Writes one line into a `String`, which cannot fail.
macro_rules! out_line {
    ($out:expr) => {
        $out.push('\n')
    };
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

fn human(
    report: &Report,
    conditions: &Conditions,
    measured: Option<&Measured>,
    evaluated: Option<&Assessment>,
) -> String {
    let mut out = String::new();
    summary(&mut out, report, conditions, measured);
    table(&mut out, report);
    notes(&mut out, report, conditions, evaluated);
    out
}

/// What was measured, the conditions, the rule and the recommendation.
fn summary(
    out: &mut String,
    report: &Report,
    conditions: &Conditions,
    measured: Option<&Measured>,
) {
    if let Some(m) = measured {
        out_line!(
            out,
            "Measured {} renewals on {}: p50 {}, p99 {} (rounded up), max {}",
            m.samples.len(),
            m.store,
            show(m.p50),
            show(m.p99),
            show(m.samples.last().copied().unwrap_or_default())
        );
    }
    out_line!(
        out,
        "Conditions: renew every {}, jitter {}, clock skew {}, clock drift {}%",
        show(conditions.renew_every),
        show(conditions.jitter),
        show(conditions.skew),
        conditions.drift * 100.0
    );
    out_line!(
        out,
        "Renewal rule, as `leasehold run` enforces it: {}",
        leasehold::RENEWAL_RULE
    );
    recommendation(out, report, conditions);
}

/// The recommended TTL, what it absorbs, and the command with it.
fn recommendation(out: &mut String, report: &Report, conditions: &Conditions) {
    let failover = if conditions.store_expiry_check.is_zero() {
        "TTL + 2 × jitter".to_owned()
    } else {
        format!(
            "TTL + 2 × jitter + {} for etcd's expiry check",
            show(conditions.store_expiry_check)
        )
    };
    out_line!(
        out,
        "Recommended TTL: {} — absorbs {} in a row{}; after a crash the election is unowned \
         for up to {} ({failover})",
        report.recommended_ttl,
        lost_renewals(report.recommended.lost_renewals_absorbed),
        if report.recommended.lost_renewals_absorbed < RECOMMENDED_LOST_RENEWALS {
            format!(
                " (not {}: no TTL up to the maximum, {}, absorbs more at this renewal period)",
                RECOMMENDED_LOST_RENEWALS,
                show_hours(leasehold::MAX_TTL)
            )
        } else {
            String::new()
        },
        show(Duration::from_millis(
            report.recommended.worst_case_failover_ms
        ))
    );
    out_line!(
        out,
        "  leasehold run --ttl {} --renew-every {} …",
        report.recommended_ttl,
        show(conditions.renew_every)
    );
}

/// Each TTL considered, with what it absorbs and its verdict.
fn table(out: &mut String, report: &Report) {
    out_line!(out);
    out_line!(
        out,
        "{:>8}  {:>22}  {:>26}  {:>20}  verdict",
        "TTL",
        "lost renewals absorbed",
        "slowest renewal absorbed",
        "worst-case failover"
    );
    let mut rows: Vec<&AssessmentJson> = report.alternatives.iter().collect();
    if let Some(e) = &report.evaluated
        && !rows.iter().any(|r| r.ttl_ms == e.ttl_ms)
    {
        rows.push(e);
        rows.sort_by_key(|r| r.ttl_ms);
    }
    for row in rows {
        let mark = if row.ttl_ms == report.recommended_ttl_ms {
            "  ← recommended"
        } else if report
            .evaluated
            .as_ref()
            .is_some_and(|e| e.ttl_ms == row.ttl_ms)
        {
            "  ← --ttl"
        } else {
            ""
        };
        let absorbed = if row.verdict == "unsafe" {
            "-".to_owned()
        } else {
            row.lost_renewals_absorbed.to_string()
        };
        out_line!(
            out,
            "{:>8}  {:>22}  {:>26}  {:>20}  {}{mark}",
            show(Duration::from_millis(row.ttl_ms)),
            absorbed,
            show(Duration::from_millis(row.slowest_renewal_absorbed_ms)),
            show(Duration::from_millis(row.worst_case_failover_ms)),
            row.verdict
        );
    }
}

/// etcd's expiry check, and the verdict on `--ttl`.
fn notes(
    out: &mut String,
    report: &Report,
    conditions: &Conditions,
    evaluated: Option<&Assessment>,
) {
    if conditions.store_expiry_check.is_zero() {
        out_line!(out);
        out_line!(
            out,
            "Worst-case failover is TTL + 2 × jitter; on etcd add up to {} (etcd checks for \
             expired leases every {}; give --store etcd://… to include it)",
            show(ETCD_EXPIRY_CHECK),
            show(ETCD_EXPIRY_CHECK)
        );
    }
    if let Some(e) = evaluated {
        out_line!(out);
        match &e.verdict {
            Verdict::Tolerant => out_line!(
                out,
                "TTL {}: safe; absorbs {} in a row, worst-case failover {}",
                show(e.ttl),
                lost_renewals(e.lost_renewals_absorbed),
                show(e.worst_case_failover)
            ),
            Verdict::Fragile => out_line!(
                out,
                "TTL {}: works but fragile: one lost or slow renewal (slower than {}) ends \
                 leadership, causing false failovers; consider {}",
                show(e.ttl),
                show(e.round_trip_absorbed),
                report.recommended_ttl
            ),
            Verdict::Unsafe { reason } => out_line!(
                out,
                "TTL {}: UNSAFE: {reason}; consider {}",
                show(e.ttl),
                report.recommended_ttl
            ),
        }
    }
}
