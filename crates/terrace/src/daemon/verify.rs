//! `space verify`'s answer: the counts, and each row found disagreeing
//! with what disagrees and where (slot, disk, device, disk offset).

use std::collections::BTreeMap;

use serde_json::{json, Value};
use terrace_engine::{Finding, Pool, Problem, ProblemKind, RedundancyReport};

/// The answer for `space` of `pool` from a verify's `report`. Fields
/// without a value (a slot with no readable place) are `null`.
pub async fn answer(pool: &Pool, space: &str, report: &RedundancyReport) -> Value {
    let devices: BTreeMap<u16, String> = pool
        .status()
        .await
        .disks
        .into_iter()
        .map(|disk| (disk.index, disk.device))
        .collect();
    let findings: Vec<Value> = report
        .findings
        .iter()
        .map(|finding| finding_json(finding, &devices))
        .collect();
    json!({
        "space": space,
        "rows": report.rows,
        "mismatched_rows": report.mismatched_rows.len(),
        "skipped_rows": report.skipped_rows,
        "unsynced_rows": report.unsynced_rows,
        "findings": findings,
        "findings_more": report.mismatched_rows.len() - report.findings.len(),
    })
}

fn finding_json(finding: &Finding, devices: &BTreeMap<u16, String>) -> Value {
    json!({
        "offset": finding.offset,
        "length": finding.length,
        "extent": finding.extent,
        "row": finding.row,
        "problems": finding
            .problems
            .iter()
            .map(|problem| problem_json(problem, devices))
            .collect::<Vec<_>>(),
    })
}

fn problem_json(problem: &Problem, devices: &BTreeMap<u16, String>) -> Value {
    let (kind, column, slot) = match problem.kind {
        ProblemKind::Copies { column } => ("copies", Some(column), None),
        ProblemKind::Parity { .. } => ("parity", None, None),
        ProblemKind::Moving { slot } => ("moving", None, Some(slot)),
        ProblemKind::Checksum { .. } => ("checksum", None, None),
        ProblemKind::Unrecoverable { .. } => ("unrecoverable", None, None),
        ProblemKind::Unreadable => ("read-error", None, None),
    };
    let parity: Vec<&str> = match problem.kind {
        ProblemKind::Parity { p, q, .. } => [(p, "P"), (q, "Q")]
            .into_iter()
            .filter_map(|(wrong, name)| wrong.then_some(name))
            .collect(),
        _ => Vec::new(),
    };
    let damaged_found = matches!(
        problem.kind,
        ProblemKind::Parity { damaged: true, .. }
            | ProblemKind::Checksum { .. }
            | ProblemKind::Unreadable
    );
    let places: Vec<Value> = problem
        .places
        .iter()
        .map(|place| {
            let disk = place.disk.map(|disk| disk.0);
            json!({
                "slot": place.slot,
                "role": place.role.to_string(),
                "disk": disk,
                "device": disk.and_then(|disk| devices.get(&disk)),
                "disk_offset": place.disk_offset,
            })
        })
        .collect();
    json!({
        "kind": kind,
        "what": problem.kind.to_string(),
        "column": column,
        "slot": slot,
        "parity": parity,
        "damaged_found": damaged_found,
        "places": places,
    })
}
