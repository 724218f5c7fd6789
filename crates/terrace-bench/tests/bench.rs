//! The benchmark's outcomes on a recording target: profiles issue the mix
//! and block size they claim, exactly N requests are in flight, a sweep
//! gives one point per outstanding-I/O value, JSON carries every field,
//! SVG plots are well-formed XML, merged runs keep the median, and the
//! striped raw target puts every byte where a stripe does.
//!
//! Nothing here asserts a duration or a rate: runs are short, and only what
//! was issued and reported is checked.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use terrace_bench::plot::write_svgs;
use terrace_bench::report::Report;
use terrace_bench::target::TargetResult;
use terrace_bench::{
    run_point, sweep, sweep_settled, Access, Profile, RunOptions, StripeTarget, SweepConfig, Target,
};
use terrace_io::Bytes;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Flush,
}

/// Remembers every request in issue order and how many were in flight at
/// most; each request completes after yielding once, so requests overlap.
struct Recorder {
    name: String,
    size_bytes: u64,
    log: Mutex<Vec<(Kind, u64, u64)>>,
    in_flight: AtomicUsize,
    in_flight_max: AtomicUsize,
}

impl Recorder {
    fn new(name: &str, size_bytes: u64) -> Recorder {
        Recorder {
            name: name.to_string(),
            size_bytes,
            log: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            in_flight_max: AtomicUsize::new(0),
        }
    }

    fn record(&self, kind: Kind, offset: u64, length: u64) {
        self.log.lock().unwrap().push((kind, offset, length));
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight_max.fetch_max(now, Ordering::SeqCst);
    }

    fn complete<T: Send + 'static>(&self, value: T) -> BoxFuture<'_, TargetResult<T>> {
        async move {
            tokio::task::yield_now().await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            Ok(value)
        }
        .boxed()
    }

    /// Forget what was recorded so far.
    fn take(&self) -> (Vec<(Kind, u64, u64)>, usize) {
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        (log, self.in_flight_max.swap(0, Ordering::SeqCst))
    }
}

impl Target for Recorder {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset: u64, length: u32) -> BoxFuture<'_, TargetResult<Bytes>> {
        self.record(Kind::Read, offset, u64::from(length));
        self.complete(Bytes::from(vec![0u8; length as usize]))
    }

    fn write(&self, offset: u64, data: Bytes) -> BoxFuture<'_, TargetResult<()>> {
        self.record(Kind::Write, offset, data.len() as u64);
        self.complete(())
    }

    fn flush(&self) -> BoxFuture<'_, TargetResult<()>> {
        self.record(Kind::Flush, 0, 0);
        self.complete(())
    }
}

const MIB: u64 = 1 << 20;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn short(outstanding: usize) -> RunOptions {
    RunOptions {
        outstanding,
        warmup: Duration::ZERO,
        duration: Duration::from_millis(150),
        ..RunOptions::default()
    }
}

/// The read share of `count` requests is within five standard deviations
/// (plus one request) of the profile's: a wrong mix fails, chance does not.
fn assert_mix(profile: &Profile, reads: u64, count: u64) {
    let expected = f64::from(profile.read_percent) / 100.0;
    let measured = reads as f64 / count as f64;
    let sigma = (expected * (1.0 - expected) / count as f64).sqrt();
    assert!(
        (measured - expected).abs() <= 5.0 * sigma + 1.0 / count as f64,
        "{}: {reads} reads of {count} requests, expected {:.0} %",
        profile.name,
        expected * 100.0
    );
}

#[test]
fn profiles_issue_the_mix_and_block_size_they_claim() {
    let runtime = runtime();
    let working_set = 16 * MIB;
    let mut profiles = Profile::standard();
    profiles.push(Profile::parse("random:70:4K").expect("custom"));
    profiles.push(Profile::parse("seq:30:1536").expect("custom"));
    for profile in &profiles {
        let target = Recorder::new("recorder", working_set);
        let point = runtime
            .block_on(run_point(&target, profile, &short(4)))
            .expect("point");
        let (log, in_flight_max) = target.take();
        let block = u64::from(profile.block_bytes);
        assert!(
            log.len() >= 100,
            "{}: only {} requests",
            profile.name,
            log.len()
        );
        for &(kind, offset, length) in &log {
            assert_ne!(
                kind,
                Kind::Flush,
                "{}: a flush while measuring",
                profile.name
            );
            assert_eq!(length, block, "{}: request of {length} bytes", profile.name);
            assert_eq!(
                offset % block,
                0,
                "{}: unaligned offset {offset}",
                profile.name
            );
            assert!(
                offset + length <= working_set,
                "{}: beyond the working set",
                profile.name
            );
        }
        let reads = log.iter().filter(|(kind, ..)| *kind == Kind::Read).count() as u64;
        match profile.read_percent {
            0 => assert_eq!(reads, 0, "{}", profile.name),
            100 => assert_eq!(reads, log.len() as u64, "{}", profile.name),
            _ => assert_mix(profile, reads, log.len() as u64),
        }
        if profile.access == Access::Sequential {
            let blocks = working_set / block;
            for pair in log.windows(2) {
                assert_eq!(
                    pair[1].1 / block,
                    (pair[0].1 / block + 1) % blocks,
                    "{}: not one stream",
                    profile.name
                );
            }
        } else {
            let distinct: BTreeSet<u64> = log.iter().map(|&(_, offset, _)| offset).collect();
            let possible = log.len().min((working_set / block) as usize);
            assert!(
                distinct.len() > possible / 2,
                "{}: offsets repeat",
                profile.name
            );
        }
        assert_eq!(in_flight_max, 4, "{}: requests in flight", profile.name);
        assert_eq!(point.ios, point.read_ios + point.write_ios);
        assert_eq!(point.bytes, point.ios * block);
        assert!(point.ios > 0 && point.ios <= log.len() as u64);
        assert_eq!(point.profile, profile.name);
        assert_eq!(point.outstanding, 4);
    }
}

#[test]
fn exactly_the_asked_number_of_requests_is_in_flight() {
    let runtime = runtime();
    let profile = Profile::parse("database").expect("standard");
    for outstanding in [1, 3, 64] {
        let target = Recorder::new("recorder", 4 * MIB);
        runtime
            .block_on(run_point(&target, &profile, &short(outstanding)))
            .expect("point");
        assert_eq!(target.take().1, outstanding);
    }
}

fn sweep_config(profiles: &[&str], depths: &[usize]) -> SweepConfig {
    SweepConfig {
        profiles: profiles
            .iter()
            .map(|name| Profile::parse(name).expect("profile"))
            .collect(),
        depths: depths.to_vec(),
        warmup: Duration::ZERO,
        duration: Duration::from_millis(30),
        working_set_bytes: Some(2 * MIB),
        progress: false,
        ..SweepConfig::default()
    }
}

fn recorded_sweep(profiles: &[&str], depths: &[usize]) -> (Report, Vec<Box<dyn Target>>) {
    let targets: Vec<Box<dyn Target>> = vec![
        Box::new(Recorder::new("first", 8 * MIB)),
        Box::new(Recorder::new("second", 4 * MIB)),
    ];
    let report = runtime()
        .block_on(sweep(&targets, &sweep_config(profiles, depths)))
        .expect("sweep");
    (report, targets)
}

#[test]
fn a_sweep_gives_one_point_per_target_profile_and_depth() {
    let depths = [1, 3, 8, 16];
    let (report, _) = recorded_sweep(&["database", "restore"], &depths);
    assert_eq!(report.points.len(), 2 * 2 * depths.len());
    for target in ["first", "second"] {
        for profile in ["database", "restore"] {
            let seen: Vec<usize> = report
                .series(profile, target)
                .map(|p| p.outstanding)
                .collect();
            assert_eq!(seen, depths, "{target} {profile}");
        }
    }
    assert_eq!(report.settings.depths, depths);
    let infos: Vec<(&str, u64, bool)> = report
        .targets
        .iter()
        .map(|t| (t.name.as_str(), t.working_set_bytes, t.prefilled))
        .collect();
    assert_eq!(infos, [("first", 2 * MIB, true), ("second", 2 * MIB, true)]);
}

#[test]
fn prefill_writes_the_working_set_once_then_flushes() {
    let working_set = 20 * MIB + 4096;
    let target = Recorder::new("only", 32 * MIB);
    runtime()
        .block_on(terrace_bench::prefill::prefill(
            &target,
            working_set,
            &mut |_| {},
        ))
        .expect("prefill");
    let (log, _) = target.take();
    let (flush, writes) = log.split_last().expect("requests");
    assert_eq!(flush.0, Kind::Flush, "prefill ends with a flush");
    assert!(writes.len() >= 3, "{} writes", writes.len());
    assert!(writes.iter().all(|(kind, ..)| *kind == Kind::Write));
    let mut covered: Vec<(u64, u64)> = writes.iter().map(|&(_, o, l)| (o, o + l)).collect();
    covered.sort_unstable();
    let mut end = 0;
    for (start, stop) in covered {
        assert_eq!(start, end, "prefill leaves a gap or overlaps at {start}");
        end = stop;
    }
    assert_eq!(end, working_set);
}

#[test]
fn json_parses_and_carries_every_field() {
    let (report, _) = recorded_sweep(&["file-copy", "random:70:4K"], &[1, 2]);
    let text = report.to_json().expect("json");
    let parsed = Report::from_json(&text).expect("parses");
    assert_eq!(
        (&parsed.machine, &parsed.profiles, &parsed.targets),
        (&report.machine, &report.profiles, &report.targets)
    );
    assert_eq!(parsed.points.len(), report.points.len());
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(1.0);
    for (back, point) in parsed.points.iter().zip(&report.points) {
        assert_eq!(
            (
                &back.profile,
                &back.target,
                back.outstanding,
                back.ios,
                back.bytes
            ),
            (
                &point.profile,
                &point.target,
                point.outstanding,
                point.ios,
                point.bytes
            )
        );
        assert!(close(back.mb_per_s, point.mb_per_s) && close(back.iops, point.iops));
        assert!(close(back.latency_p99_us, point.latency_p99_us));
    }
    let value: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let has = |object: &serde_json::Value, keys: &[&str], what: &str| {
        for key in keys {
            assert!(object.get(key).is_some(), "{what} lacks {key}: {object}");
        }
    };
    has(
        &value,
        &[
            "started", "machine", "settings", "profiles", "targets", "points",
        ],
        "report",
    );
    has(
        &value["machine"],
        &["hostname", "kernel", "cpu_model", "cpus", "memory_bytes"],
        "machine",
    );
    has(
        &value["settings"],
        &[
            "depths",
            "warmup_seconds",
            "duration_seconds",
            "seed",
            "sequential",
        ],
        "settings",
    );
    for profile in value["profiles"].as_array().expect("profiles") {
        has(
            profile,
            &["name", "access", "read_percent", "block_bytes"],
            "profile",
        );
    }
    for target in value["targets"].as_array().expect("targets") {
        has(
            target,
            &["name", "size_bytes", "working_set_bytes", "prefilled"],
            "target",
        );
    }
    let points = value["points"].as_array().expect("points");
    assert_eq!(points.len(), 2 * 2 * 2);
    for point in points {
        has(
            point,
            &[
                "profile",
                "target",
                "outstanding",
                "ios",
                "read_ios",
                "write_ios",
                "bytes",
                "seconds",
                "mb_per_s",
                "iops",
                "latency_mean_us",
                "latency_p99_us",
                "cpu_us_per_io",
            ],
            "point",
        );
        let ios = point["ios"].as_u64().expect("ios");
        assert!(ios > 0, "a point without I/O: {point}");
        let bytes = point["bytes"].as_f64().expect("bytes");
        let seconds = point["seconds"].as_f64().expect("seconds");
        let mb_per_s = point["mb_per_s"].as_f64().expect("mb/s");
        assert!((mb_per_s - bytes / seconds / 1e6).abs() <= 1e-6 * mb_per_s.max(1.0));
    }
}

/// Check that `text` is well-formed XML: one root element, every tag closed
/// in order, attributes quoted, no stray `<` or `&`. Returns the element
/// names in document order.
fn well_formed(text: &str) -> Vec<String> {
    let mut rest = text.trim_start();
    let mut open: Vec<String> = Vec::new();
    let mut elements = Vec::new();
    let mut roots = 0;
    while let Some(start) = rest.find(['<', '&']) {
        let (before, tail) = rest.split_at(start);
        assert!(
            !open.is_empty() || before.trim().is_empty(),
            "text outside the root element: {before:?}"
        );
        if let Some(after) = tail.strip_prefix('&') {
            let end = after.find(';').expect("unterminated entity");
            let entity = &after[..end];
            assert!(
                ["amp", "lt", "gt", "quot", "apos"].contains(&entity) || entity.starts_with('#'),
                "unknown entity &{entity};"
            );
            rest = &after[end + 1..];
            continue;
        }
        if let Some(after) = tail.strip_prefix("<?") {
            rest = &after[after.find("?>").expect("unterminated declaration") + 2..];
            continue;
        }
        if let Some(after) = tail.strip_prefix("<!--") {
            rest = &after[after.find("-->").expect("unterminated comment") + 3..];
            continue;
        }
        let end = tail.find('>').expect("unterminated tag");
        let tag = &tail[1..end];
        assert!(!tag.contains('<'), "'<' inside a tag: {tag:?}");
        rest = &tail[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            let expected = open.pop().expect("closing tag without an open one");
            assert_eq!(name.trim(), expected, "tags closed out of order");
            continue;
        }
        let self_closing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let name = tag.split_whitespace().next().expect("tag name").to_string();
        assert_eq!(
            tag.matches('"').count() % 2,
            0,
            "unbalanced quotes in <{tag}>"
        );
        if open.is_empty() {
            roots += 1;
        }
        elements.push(name.clone());
        if !self_closing {
            open.push(name);
        }
    }
    assert!(open.is_empty(), "unclosed tags: {open:?}");
    assert!(rest.trim().is_empty(), "text after the root element");
    assert_eq!(roots, 1, "one root element");
    elements
}

#[test]
fn svg_plots_are_written_and_well_formed() {
    let (report, _) = recorded_sweep(&["database", "streaming", "random:70:4K"], &[1, 3, 8]);
    let directory = tempfile::tempdir().expect("temp dir");
    let written = write_svgs(&report, &directory.path().join("plots")).expect("svgs");
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["database.svg", "streaming.svg", "random-70-4K.svg"]);
    for path in &written {
        let text = std::fs::read_to_string(path).expect("readable");
        let elements = well_formed(&text);
        assert_eq!(elements[0], "svg", "{}", path.display());
        let lines = elements.iter().filter(|e| *e == "polyline").count();
        assert!(
            lines >= 2,
            "{}: {lines} lines for 2 targets",
            path.display()
        );
        for target in ["first", "second"] {
            assert!(
                text.contains(target),
                "{}: no legend for {target}",
                path.display()
            );
        }
        assert!(
            text.contains("outstanding I/Os"),
            "{}: no x axis label",
            path.display()
        );
        let random = !path.ends_with("streaming.svg");
        assert_eq!(text.contains("IO/s"), random, "{}", path.display());
        assert_eq!(text.contains("p99 latency"), random, "{}", path.display());
        assert_eq!(text.contains("MB/s"), !random, "{}", path.display());
    }
}

#[test]
fn the_xml_check_rejects_broken_documents() {
    for broken in [
        "<svg><g></svg></g>",
        "<svg><g></svg>",
        "<svg a=\"1></svg>",
        "<svg></svg><svg></svg>",
        "<svg>&nbsp;</svg>",
    ] {
        let result = std::panic::catch_unwind(|| well_formed(broken));
        assert!(result.is_err(), "accepted {broken:?}");
    }
    assert_eq!(
        well_formed("<?xml version=\"1.0\"?><svg><g/></svg>"),
        ["svg", "g"]
    );
}

#[test]
fn merged_runs_keep_the_median_of_each_point() {
    let (first, _) = recorded_sweep(&["database"], &[1, 2]);
    let mut runs = Vec::new();
    for scale in [1.0, 3.0, 2.0] {
        let mut run = first.clone();
        for point in &mut run.points {
            point.mb_per_s = scale * 100.0;
        }
        runs.push(run);
    }
    let (other, _) = recorded_sweep(&["restore"], &[4]);
    runs.push(other);
    let merged = Report::merge(runs).expect("merged");
    assert_eq!(merged.settings.depths, [1, 2, 4]);
    let names: Vec<&str> = merged.profiles.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["database", "restore"]);
    assert_eq!(merged.points.len(), 2 * 2 + 2);
    for point in merged.points.iter().filter(|p| p.profile == "database") {
        assert_eq!(point.mb_per_s, 200.0, "the median of 100, 300, 200");
        let spread = point.spread.expect("the spread of the runs");
        assert_eq!(spread.runs, 3);
        assert_eq!((spread.mb_per_s_min, spread.mb_per_s_max), (100.0, 300.0));
    }
    let svg = terrace_bench::plot::render_svg(&merged, &merged.profiles[0]).expect("svg");
    well_formed(&svg);
    assert!(
        svg.contains("IO/s") && svg.contains("p99 latency"),
        "a random profile is plotted in IO/s beside its p99 latency"
    );
    let plain = terrace_bench::plot::render_svg(&first, &first.profiles[0]).expect("svg");
    assert!(
        svg.matches("<line").count() > plain.matches("<line").count(),
        "merged points carry error bars"
    );
    assert!(Report::merge(Vec::new()).is_none());
}

#[test]
fn the_stripe_target_puts_every_byte_where_a_stripe_does() {
    const UNIT: u64 = 64 << 10;
    let directory = tempfile::tempdir().expect("temp dir");
    let paths: Vec<_> = (0..3)
        .map(|i| {
            let path = directory.path().join(format!("d{i}.img"));
            std::fs::File::create(&path)
                .and_then(|f| f.set_len(4 * UNIT))
                .expect("file");
            path
        })
        .collect();
    let data: Vec<u8> = (0..12 * UNIT).map(|i| (i * 7 % 251) as u8).collect();
    let runtime = runtime();
    {
        let target = StripeTarget::open("raw", &paths, UNIT).expect("stripe");
        assert_eq!(target.size_bytes(), 12 * UNIT);
        runtime.block_on(async {
            // One request across four units and parts of two more.
            let (start, end) = (UNIT / 2, 5 * UNIT + 4096);
            target
                .write(
                    start,
                    Bytes::copy_from_slice(&data[start as usize..end as usize]),
                )
                .await
                .expect("write");
            target
                .write(0, Bytes::copy_from_slice(&data[..(UNIT / 2) as usize]))
                .await
                .expect("write head");
            target
                .write(end, Bytes::copy_from_slice(&data[end as usize..]))
                .await
                .expect("write tail");
            target.flush().await.expect("flush");
            let read = target.read(4096, (7 * UNIT) as u32).await.expect("read");
            assert_eq!(&read[..], &data[4096..(4096 + 7 * UNIT) as usize]);
        });
    }
    for (unit, chunk) in data.chunks(UNIT as usize).enumerate() {
        let file = std::fs::read(&paths[unit % 3]).expect("file");
        let at = (unit / 3) * UNIT as usize;
        assert!(
            file[at..at + UNIT as usize] == *chunk,
            "unit {unit} misplaced"
        );
    }
}

#[test]
fn a_settled_sweep_waits_before_each_profile_and_stops_on_its_error() {
    let targets: Vec<Box<dyn Target>> = vec![
        Box::new(Recorder::new("first", 8 * MIB)),
        Box::new(Recorder::new("second", 4 * MIB)),
    ];
    let config = sweep_config(&["streaming", "restore"], &[1, 2]);
    let calls = Mutex::new(Vec::new());
    let mut settle = |name: &str| -> BoxFuture<'static, Result<(), String>> {
        calls.lock().unwrap().push(name.to_string());
        Box::pin(async { Ok(()) })
    };
    let report = runtime()
        .block_on(sweep_settled(&targets, &config, &mut settle))
        .expect("sweep");
    assert_eq!(report.points.len(), 2 * 2 * 2);
    assert_eq!(
        *calls.lock().unwrap(),
        ["first", "first", "second", "second"],
        "once per target and profile"
    );

    // Refuse the second call: the first profile (reads, after the prefill's
    // writes) ran whole, the second (writes) never started, and the sweep
    // fails naming the target and the reason.
    let recorder = Arc::new(Recorder::new("only", 8 * MIB));
    let targets: Vec<Box<dyn Target>> = vec![Box::new(Arc::clone(&recorder))];
    let mut count = 0;
    let mut settle = |_: &str| -> BoxFuture<'static, Result<(), String>> {
        count += 1;
        let result = if count == 1 {
            Ok(())
        } else {
            Err("log still destaging".to_string())
        };
        Box::pin(async move { result })
    };
    let error = runtime()
        .block_on(sweep_settled(&targets, &config, &mut settle))
        .expect_err("the second settle fails");
    assert!(
        error.to_string().contains("only") && error.to_string().contains("log still destaging"),
        "{error}"
    );
    let log = recorder.log.lock().unwrap();
    let first_read = log.iter().position(|(kind, ..)| *kind == Kind::Read);
    let first_read = first_read.expect("the first profile read");
    assert!(
        log[first_read..]
            .iter()
            .all(|(kind, ..)| *kind == Kind::Read),
        "no write after the first profile's reads"
    );
}
