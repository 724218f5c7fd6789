//! The daemon's log of what changes in a pool on its own: a disk failing,
//! going missing or coming back, a job starting and ending, a space losing
//! or regaining redundancy, a write-back log degrading or failing. An admin
//! reading the log after the fact finds when each happened and why, in the
//! words `pool status` uses.
//!
//! The pool's watcher hears of each change from the pool's events (a disk's
//! condition, a commit, a job starting or ending, a log failing over to
//! write-through; see `terrace_engine::PoolEvent`), then takes a
//! [`Summary`] of its status and logs what differs from the one before
//! ([`changes`]), in the words `pool status` uses. The first summary is
//! compared with a pool in which everything is well, so a pool served
//! degraded says so once at the start.

use std::collections::BTreeMap;

use crate::api::PoolView;

/// What the log follows of one pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    name: String,
    /// ONLINE, DEGRADED, READ-ONLY or DATA-LOSS, and why.
    state: (String, String),
    /// By index: the device, its state and why.
    disks: BTreeMap<u16, (String, String, String)>,
    /// By id: what the job does, its state and why.
    jobs: BTreeMap<u64, (String, String, String)>,
    /// By name: the space's health, and its log's health and failure.
    spaces: BTreeMap<String, SpaceSummary>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct SpaceSummary {
    health: String,
    log_health: Option<String>,
    write_through: Option<String>,
}

impl Summary {
    pub fn of(view: &PoolView) -> Summary {
        Summary {
            name: view.summary.name.clone(),
            state: (view.summary.state.clone(), view.summary.reason.clone()),
            disks: view
                .disks
                .iter()
                .map(|disk| {
                    let reason = disk.reason.clone().unwrap_or_default();
                    let state = (disk.device.clone(), disk.state.clone(), reason);
                    (disk.index, state)
                })
                .collect(),
            jobs: view
                .jobs
                .iter()
                .map(|job| {
                    let state = (
                        job.description.clone(),
                        job.state.clone(),
                        job.reason.clone().unwrap_or_default(),
                    );
                    (job.id, state)
                })
                .collect(),
            spaces: view
                .spaces
                .iter()
                .map(|space| {
                    let cache = space.cache.as_ref();
                    let summary = SpaceSummary {
                        health: space.health.clone(),
                        log_health: cache.map(|cache| cache.log_health.clone()),
                        write_through: cache.and_then(|cache| cache.write_through.clone()),
                    };
                    (space.name.clone(), summary)
                })
                .collect(),
        }
    }
}

/// What changed from `before` (`None`: the first look, against a pool
/// where every disk is online, no job runs and every space is healthy) to
/// `now`, one line each.
pub fn changes(before: Option<&Summary>, now: &Summary) -> Vec<String> {
    let pool = &now.name;
    let mut lines = Vec::new();
    let (state, reason) = &now.state;
    let state_before = before.map_or("ONLINE", |b| b.state.0.as_str());
    if state != state_before {
        lines.push(format!("pool {pool}: {state_before} -> {state}: {reason}"));
    }
    for (index, (device, state, reason)) in &now.disks {
        let was = match before {
            Some(before) => before.disks.get(index).map(|(_, state, _)| state.as_str()),
            // A disk emptied and released keeps its row: no news.
            None if state == "REMOVED" => Some("REMOVED"),
            None => Some("ONLINE"),
        };
        match was {
            Some(was) if was == state => {}
            Some(was) => lines.push(format!(
                "pool {pool}: disk {index} ({device}) {was} -> {state}{}",
                because(reason)
            )),
            None => lines.push(format!(
                "pool {pool}: disk {index} ({device}) added, {state}"
            )),
        }
    }
    for (id, (description, state, reason)) in &now.jobs {
        let was = before.and_then(|before| before.jobs.get(id).map(|(_, state, _)| state.as_str()));
        match was {
            Some(was) if was == state => {}
            Some(was) => lines.push(format!(
                "pool {pool}: job {id} ({description}) {was} -> {state}{}",
                because(reason)
            )),
            // At the first look only what is still to do is news.
            None if before.is_none() && state != "running" && state != "paused" => {}
            None => lines.push(format!(
                "pool {pool}: job {id} ({description}) {state}{}",
                because(reason)
            )),
        }
    }
    for (name, space) in &now.spaces {
        let was = before.and_then(|before| before.spaces.get(name));
        lines.extend(space_changes(pool, name, was, space));
    }
    lines
}

fn space_changes(
    pool: &str,
    name: &str,
    before: Option<&SpaceSummary>,
    now: &SpaceSummary,
) -> Vec<String> {
    let mut lines = Vec::new();
    let health_before = before.map_or("healthy", |b| b.health.as_str());
    if now.health != health_before {
        lines.push(format!(
            "pool {pool}: space {name} {health_before} -> {}",
            now.health
        ));
    }
    let log_before = before.map_or(Some("healthy"), |b| b.log_health.as_deref());
    if let (Some(was), Some(log)) = (log_before, &now.log_health) {
        if was != log {
            lines.push(format!(
                "pool {pool}: space {name}: write-back log {was} -> {log}"
            ));
        }
    }
    let failed_before = before.and_then(|b| b.write_through.as_ref());
    match (failed_before, &now.write_through) {
        (None, Some(reason)) => lines.push(format!("pool {pool}: space {name}: {reason}")),
        (Some(_), None) => lines.push(format!(
            "pool {pool}: space {name}: write-back log in use again"
        )),
        _ => {}
    }
    lines
}

fn because(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(disks: &[(u16, &str, &str)], jobs: &[(u64, &str, &str)]) -> Summary {
        Summary {
            name: "tank".into(),
            state: ("ONLINE".into(), "all disks online".into()),
            disks: disks
                .iter()
                .map(|&(i, state, reason)| {
                    (i, (format!("/d{i}"), state.to_string(), reason.to_string()))
                })
                .collect(),
            jobs: jobs
                .iter()
                .map(|&(id, state, reason)| {
                    let job = ("repair".to_string(), state.to_string(), reason.to_string());
                    (id, job)
                })
                .collect(),
            spaces: BTreeMap::new(),
        }
    }

    #[test]
    fn a_disk_failing_and_its_repair_are_logged_once_each() {
        let healthy = pool(&[(0, "ONLINE", ""), (1, "ONLINE", "")], &[]);
        assert!(changes(Some(&healthy), &healthy).is_empty());
        assert!(
            changes(None, &healthy).is_empty(),
            "all well: nothing to say"
        );
        let mut failed = pool(&[(0, "ONLINE", ""), (1, "FAILED", "read error")], &[]);
        failed.state = ("DEGRADED".into(), "1 disk failed".into());
        assert_eq!(
            changes(Some(&healthy), &failed),
            vec![
                "pool tank: ONLINE -> DEGRADED: 1 disk failed",
                "pool tank: disk 1 (/d1) ONLINE -> FAILED: read error",
            ]
        );
        let mut repairing = failed.clone();
        repairing.jobs = pool(&[], &[(4, "running", "")]).jobs;
        assert_eq!(
            changes(Some(&failed), &repairing),
            vec!["pool tank: job 4 (repair) running"]
        );
        let mut repaired = repairing.clone();
        repaired.jobs = pool(&[], &[(4, "done", "")]).jobs;
        assert_eq!(
            changes(Some(&repairing), &repaired),
            vec!["pool tank: job 4 (repair) running -> done"]
        );
        assert!(changes(Some(&repaired), &repaired).is_empty());
    }

    #[test]
    fn the_first_look_reports_only_what_is_not_well() {
        let mut now = pool(
            &[
                (0, "ONLINE", ""),
                (1, "MISSING", "not found"),
                (2, "REMOVED", ""),
            ],
            &[],
        );
        now.jobs = pool(&[], &[(1, "done", ""), (2, "running", "")]).jobs;
        now.spaces.insert(
            "vm".into(),
            SpaceSummary {
                health: "degraded".into(),
                log_health: Some("healthy".into()),
                write_through: None,
            },
        );
        assert_eq!(
            changes(None, &now),
            vec![
                "pool tank: disk 1 (/d1) ONLINE -> MISSING: not found",
                "pool tank: job 2 (repair) running",
                "pool tank: space vm healthy -> degraded",
            ]
        );
    }

    #[test]
    fn a_log_degrading_then_failing_is_logged() {
        let space = |log: &str, failed: Option<&str>| {
            let mut summary = pool(&[], &[]);
            summary.spaces.insert(
                "p".into(),
                SpaceSummary {
                    health: "healthy".into(),
                    log_health: Some(log.into()),
                    write_through: failed.map(str::to_string),
                },
            );
            summary
        };
        let healthy = space("healthy", None);
        let degraded = space("degraded", None);
        let failed = space("offline", Some("write-through: the log failed (gone)"));
        assert_eq!(
            changes(Some(&healthy), &degraded),
            vec!["pool tank: space p: write-back log healthy -> degraded"]
        );
        assert_eq!(
            changes(Some(&degraded), &failed),
            vec![
                "pool tank: space p: write-back log degraded -> offline",
                "pool tank: space p: write-through: the log failed (gone)",
            ]
        );
    }
}
