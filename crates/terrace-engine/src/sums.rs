//! A space's block sums as the engine holds them: pages of
//! `terrace_meta::sums` cached in memory, loaded on first use from the
//! space's [`SumsStore`], changed by writes, and written back in batches
//! (see docs/design/integrity.md for when a page must be durable).
//!
//! ```text
//!   get(blocks)  ──► load missing pages (newest whole copy, else unknown)
//!   set(blocks)  ──► load missing pages, change entries, page dirty
//!   write_back() ──► changed slots appended to the journal ([`Journal`]);
//!                    pages changed whole or much: generation + 1, every
//!                    copy (runs of consecutive pages as one write); the
//!                    journal full: every dirty page so, flushed, a new
//!                    epoch (a checkpoint); the pool flushes after
//!   recover()    ──► at an import, the journal laid over the pages
//! ```
//!
//! A page is loaded once however many requests want it at the same time
//! (the first loads it, the others wait; loads of different pages go on
//! together), and a change made while its page is
//! being written back leaves it dirty for the next. Clean pages beyond the
//! budget are dropped, least recently used first; dirty ones stay until
//! written. Depends on nothing of the engine above its errors and the
//! keyed locks of `row_lock` (one per page being loaded): the store
//! is whatever keeps the pages (a hidden mirrored volume).

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use futures::future::BoxFuture;
use futures::{stream, StreamExt};
use rustc_hash::FxHashMap;
use terrace_io::{Bytes, BytesMut};
use terrace_meta::sums::{
    page_of, JournalEntry, JournalPage, SumsPage, JOURNAL_MAGIC, JOURNAL_PER_PAGE, SUMS_PER_PAGE,
    ZEROES,
};
use terrace_meta::SpaceId;

use crate::error::EngineError;
use crate::row_lock::RowLocks;

/// Where a space's sums pages live: every copy of each page.
pub(crate) trait SumsStore: Send + Sync {
    /// Every copy of page `index` as read; a copy that could not be read
    /// is an error.
    fn read_page(&self, index: u64) -> BoxFuture<'_, Vec<Result<BytesMut, EngineError>>>;
    /// Write `bytes`, whole pages, as pages `first`, `first + 1`, … to
    /// every copy. Durable only once the pool's disks are flushed.
    fn write_pages(&self, first: u64, bytes: Bytes) -> BoxFuture<'_, Result<(), EngineError>>;
    /// Pages it has room for: blocks past them (the rows of a space's last
    /// extent beyond its end) have no sums.
    fn pages(&self) -> u64;
    /// Pages of journal it keeps after them (see [`Journal`]; 0: none,
    /// changed sums go home in whole pages only).
    fn journal_pages(&self) -> u64;
    /// Make what was written so far durable.
    fn flush(&self) -> BoxFuture<'_, Result<(), EngineError>>;
    /// Give the pages `pages` room on the disks where they have none yet
    /// (a thin space's sums), so that writing them back never waits for
    /// room: refused when the pool has none.
    fn provide(&self, pages: Range<u64>) -> BoxFuture<'_, Result<(), EngineError>>;
}

struct Cached {
    page: SumsPage,
    dirty: bool,
    /// Its write-back is under way: it stays cached, clean or not, until
    /// the store holds it, as a load meanwhile would read what the store
    /// held before (or, on fresh slabs, take it for blank).
    writing: bool,
    /// When it was last used, by the cache's own clock.
    used: u64,
    /// Slots changed since the page or the journal last made them
    /// durable: journaled at the next write-back (see [`Journal`]).
    changed: Vec<u16>,
    /// Changed in a way only writing the page makes durable (replaced
    /// whole, or more slots changed than are worth journaling).
    whole: bool,
}

impl Cached {
    fn new(page: SumsPage, dirty: bool, used: u64) -> Cached {
        Cached {
            page,
            dirty,
            writing: false,
            used,
            changed: Vec::new(),
            whole: dirty,
        }
    }

    /// Slot `slot` changed.
    fn change(&mut self, slot: usize) {
        self.dirty = true;
        if self.whole {
            return;
        }
        if self.changed.len() >= PAGE_CHANGES {
            self.whole = true;
            self.changed = Vec::new();
        } else {
            self.changed.push(slot as u16);
        }
    }
}

/// Where the changed sums of a space go between whole writes of its
/// pages: a journal of [`JournalPage`]s after the pages, appended at each
/// write-back while it has room; when it has none, every dirty page is
/// written and flushed, and the journal begins again at position 0 in a
/// new epoch (a checkpoint). Dirty pages past the cache's budget are
/// written whole at the write-back, least recently used first.
///
/// A random write changes one sum in a page of 506: writing that page
/// home after each destage round or write intent release writes 4 KiB for
/// 8 bytes, as many bytes as the data on a large space. A journal entry
/// is 24 bytes, and a page written whole at a checkpoint carries every
/// change made to it since.
#[derive(Debug, Default)]
struct Journal {
    epoch: u64,
    /// The next position to append at.
    next: u64,
    /// Every dirty page must be written (and flushed) before anything is
    /// journaled: just opened (the journal's old entries are laid over
    /// the pages only in memory), or a checkpoint failed.
    checkpoint: bool,
    /// Pages only, no journal (while the store's layout changes).
    paused: bool,
}

impl Journal {
    /// A journal just opened, in `epoch`: nothing is journaled before
    /// every dirty page is written whole (`checkpoint`).
    fn opened(epoch: u64) -> Journal {
        Journal {
            epoch,
            next: 0,
            checkpoint: true,
            paused: false,
        }
    }

    /// Begin again at position 0 of the next epoch (what the last one
    /// journaled is on the pages now).
    fn next_epoch(&mut self) {
        self.epoch += 1;
        self.next = 0;
    }
}

#[derive(Default)]
struct State {
    /// Fx: the keys are page indices, and the map is asked on every
    /// request (SipHash's defence against chosen keys buys nothing here).
    pages: FxHashMap<u64, Cached>,
    clock: u64,
    /// Pages found with copies but none whole, since the space opened.
    refused: u64,
    /// Of sums kept on slabs zeroed when they were created (this run):
    /// the pages written since. Any other page is blank, known without
    /// reading it. `None`: sums that were there when the pool opened.
    written: Option<std::collections::BTreeSet<u64>>,
    /// A blank page (above), or one whose every copy reads as zeroes
    /// (never written), covers blocks known to be zero (the space was
    /// created with its sums, its slabs zeroed): its sums are [`ZEROES`],
    /// not unknown.
    blank_zeroes: bool,
    journal: Journal,
    /// Pages cached past which [`Sums::trim`] looks again, after a look
    /// that found too few clean pages to drop (dirty ones stay until the
    /// journal's checkpoint): it counts every page, under the lock every
    /// request takes.
    trim_at: usize,
}

/// The cached sums of one space.
pub(crate) struct Sums {
    space: SpaceId,
    /// Clean pages kept at most (dirty ones stay beyond it).
    budget_pages: usize,
    state: Mutex<State>,
    /// One lock per page being loaded (key `(page, 0)`), so each is
    /// loaded once; loads of different pages go on together.
    loading: RowLocks,
    /// Held while dirty pages are written back, one batch at a time.
    writing: futures::lock::Mutex<()>,
}

impl Sums {
    /// The sums of `space`; `fresh`: kept on slabs zeroed just now (no
    /// page need be read until written).
    pub(crate) fn new(space: SpaceId, budget_pages: usize, fresh: bool) -> Sums {
        Sums {
            space,
            budget_pages: budget_pages.max(1),
            state: Mutex::new(State {
                written: fresh.then(Default::default),
                journal: Journal::opened(1),
                ..State::default()
            }),
            loading: RowLocks::default(),
            writing: futures::lock::Mutex::new(()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pages holding the sums of `blocks`.
    fn pages(blocks: &Range<u64>) -> Range<u64> {
        if blocks.is_empty() {
            return 0..0;
        }
        page_of(blocks.start).0..page_of(blocks.end - 1).0 + 1
    }

    /// Whether every page holding the sums of `blocks` is cached.
    fn cached(state: &State, blocks: &Range<u64>) -> bool {
        Self::pages(blocks).all(|page| state.pages.contains_key(&page))
    }

    /// Load the pages of `pages` that are not cached.
    async fn load(&self, store: &dyn SumsStore, pages: Range<u64>) {
        let missing = |state: &State| pages.clone().any(|p| !state.pages.contains_key(&p));
        if !missing(&self.state()) {
            return;
        }
        for index in pages {
            let _loading = self.loading.lock((index, 0)).await;
            let blank = {
                let state = self.state();
                if state.pages.contains_key(&index) {
                    continue;
                }
                state
                    .written
                    .as_ref()
                    .is_some_and(|written| !written.contains(&index))
            };
            let copies = if blank {
                Vec::new()
            } else {
                store.read_page(index).await
            };
            // A journal page where pages now are (its space grew) was
            // never a page of sums.
            let any_written = copies.iter().any(|copy| {
                copy.as_ref().is_ok_and(|bytes| {
                    bytes.iter().any(|&byte| byte != 0) && !bytes.starts_with(&JOURNAL_MAGIC)
                })
            });
            // Every copy read, and all zeroes: never written.
            let never_written = !copies.is_empty()
                && copies.iter().all(|copy| {
                    copy.as_ref()
                        .is_ok_and(|bytes| bytes.iter().all(|&byte| byte == 0))
                });
            let decoded = copies.into_iter().map(|copy| match copy {
                Ok(bytes) => SumsPage::decode(&bytes, self.space, index),
                Err(_) => Err(terrace_meta::sums::SumsPageError::Blank),
            });
            let page = SumsPage::newest(decoded);
            let mut state = self.state();
            if page.is_none() && any_written {
                state.refused += 1;
            }
            let page = match page {
                Some(page) => page,
                None if (blank || never_written) && state.blank_zeroes => {
                    SumsPage::filled(self.space, index, ZEROES)
                }
                None => SumsPage::unknown(self.space, index),
            };
            state.clock += 1;
            let used = state.clock;
            state.pages.insert(index, Cached::new(page, false, used));
        }
    }

    /// The sums of `blocks` (0: not known).
    pub(crate) async fn get(&self, store: &dyn SumsStore, blocks: Range<u64>) -> Vec<u64> {
        // One lock on the way: every request asks, from every core.
        if let Some(sums) = self.try_get(&blocks) {
            return sums;
        }
        self.load(store, Self::pages(&blocks)).await;
        self.try_get(&blocks)
            .expect("loaded above and kept while clean pages fit")
    }

    /// The sums of `blocks` if their pages are cached (and the cache
    /// trimmed if that took it past its budget).
    fn try_get(&self, blocks: &Range<u64>) -> Option<Vec<u64>> {
        let mut state = self.state();
        if !Self::cached(&state, blocks) {
            return None;
        }
        state.clock += 1;
        let now = state.clock;
        let mut sums = Vec::with_capacity((blocks.end - blocks.start) as usize);
        for block in blocks.clone() {
            let (index, slot) = page_of(block);
            let cached = state.pages.get_mut(&index).expect("checked above");
            cached.used = now;
            sums.push(cached.page.sums[slot]);
        }
        let over = state.pages.len() > self.budget_pages.max(state.trim_at);
        drop(state);
        if over {
            self.trim();
        }
        Some(sums)
    }

    /// Set the sums of the blocks from `first` on to `sums` (0 forgets).
    pub(crate) async fn set(&self, store: &dyn SumsStore, first: u64, sums: &[u64]) {
        let kept = (store.pages() * SUMS_PER_PAGE as u64)
            .saturating_sub(first)
            .min(sums.len() as u64) as usize;
        let sums = &sums[..kept];
        if !self.try_set(first, sums) {
            let blocks = first..first + sums.len() as u64;
            self.load(store, Self::pages(&blocks)).await;
            assert!(
                self.try_set(first, sums),
                "loaded above and kept while clean pages fit"
            );
        }
    }

    /// Set the sums from `first` on if their pages are cached.
    fn try_set(&self, first: u64, sums: &[u64]) -> bool {
        let blocks = first..first + sums.len() as u64;
        let mut state = self.state();
        if !Self::cached(&state, &blocks) {
            return false;
        }
        state.clock += 1;
        let now = state.clock;
        for (block, &sum) in blocks.zip(sums) {
            let (index, slot) = page_of(block);
            let cached = state.pages.get_mut(&index).expect("checked above");
            if cached.page.sums[slot] != sum {
                cached.page.sums[slot] = sum;
                cached.change(slot);
            }
            cached.used = now;
        }
        true
    }

    /// Set every sum of `blocks` to `sum` (unknown: a range trimmed, or
    /// [`ZEROES`]: zeroed): pages they cover whole are replaced without
    /// being read first.
    pub(crate) async fn fill(&self, store: &dyn SumsStore, blocks: Range<u64>, sum: u64) {
        if blocks.is_empty() {
            return;
        }
        let per = SUMS_PER_PAGE as u64;
        let whole = blocks.start.div_ceil(per)..blocks.end / per;
        if whole.is_empty() {
            let filled = vec![sum; (blocks.end - blocks.start) as usize];
            return self.set(store, blocks.start, &filled).await;
        }
        let head = blocks.start..whole.start * per;
        let tail = whole.end * per..blocks.end;
        for part in [head, tail] {
            if !part.is_empty() {
                let filled = vec![sum; (part.end - part.start) as usize];
                self.set(store, part.start, &filled).await;
            }
        }
        let mut state = self.state();
        state.clock += 1;
        let used = state.clock;
        for index in whole.start..whole.end.min(store.pages()) {
            state.pages.insert(
                index,
                Cached::new(SumsPage::filled(self.space, index, sum), true, used),
            );
        }
    }

    /// Pages changed and not yet written back.
    #[cfg(test)]
    pub(crate) fn dirty_pages(&self) -> usize {
        self.state().pages.values().filter(|c| c.dirty).count()
    }

    /// Pages that had copies on disk but none whole (their sums became
    /// unknown), since the space opened.
    #[cfg(test)]
    pub(crate) fn refused_pages(&self) -> u64 {
        self.state().refused
    }

    /// Write every dirty page covering `blocks` (all of them: `None`) to
    /// every copy; the pool flushes its disks after (its flush calls
    /// [`Registry::write_back_all`] first, the only caller). A page changed
    /// meanwhile stays dirty.
    ///
    /// Consecutive pages go out as one write of up to [`RUN_PAGES`], and
    /// [`WRITE_BACK_PARALLEL`] writes are in flight: the pages a burst of
    /// random writes dirtied go home in a few large requests, not one page
    /// after another.
    pub(crate) async fn write_back(
        &self,
        store: &dyn SumsStore,
        blocks: Option<Range<u64>>,
    ) -> Result<(), EngineError> {
        let _writing = self.writing.lock().await;
        let wanted = blocks.map(|blocks| Self::pages(&blocks));
        let journal_pages = store.journal_pages();
        let (written, logged, runs, journal_at, appended, checkpoint) = {
            let mut state = self.state();
            let state = &mut *state;
            let dirty: Vec<u64> = state
                .pages
                .iter()
                .filter(|(index, cached)| {
                    cached.dirty && wanted.as_ref().is_none_or(|w| w.contains(index))
                })
                .map(|(&index, _)| index)
                .collect();
            let journaling = wanted.is_none() && journal_pages > 0 && !state.journal.paused;
            // Pages written whole, pages journaled and their entries.
            let (mut indices, logged, entries) = if journaling && !state.journal.checkpoint {
                let (mut whole, mut logged): (Vec<u64>, Vec<u64>) =
                    dirty.iter().partition(|index| state.pages[index].whole);
                // Dirty pages stay cached until they are written whole:
                // past the cache's budget, the least recently used go home
                // now (their entries journaled before are then older than
                // the page, and skipped at an import) rather than all of
                // them at a checkpoint.
                if dirty.len() > self.budget_pages {
                    let keep = self.budget_pages - self.budget_pages / 8;
                    let excess = (dirty.len() - keep).min(logged.len());
                    logged.sort_unstable_by_key(|index| state.pages[index].used);
                    whole.extend(logged.drain(..excess));
                }
                logged.retain(|index| !state.pages[index].changed.is_empty());
                let entries: Vec<JournalEntry> = logged
                    .iter()
                    .flat_map(|&index| {
                        let cached = &state.pages[&index];
                        let mut slots = cached.changed.clone();
                        slots.sort_unstable();
                        slots.dedup();
                        slots.into_iter().map(move |slot| JournalEntry {
                            block: index * SUMS_PER_PAGE as u64 + slot as u64,
                            sum: cached.page.sums[slot as usize],
                            generation: cached.page.generation,
                        })
                    })
                    .collect();
                let needed = entries.len().div_ceil(JOURNAL_PER_PAGE) as u64;
                if state.journal.next + needed <= journal_pages {
                    (whole, logged, entries)
                } else {
                    state.journal.checkpoint = true;
                    (dirty, Vec::new(), Vec::new())
                }
            } else {
                (dirty, Vec::new(), Vec::new())
            };
            let checkpoint = journaling && state.journal.checkpoint;
            indices.sort_unstable();
            let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
            for &index in &indices {
                let cached = state.pages.get_mut(&index).expect("listed above");
                cached.dirty = false;
                cached.whole = false;
                cached.changed = Vec::new();
                cached.writing = true;
                cached.page.generation += 1;
                let page = cached.page.encode();
                match runs.last_mut() {
                    Some((first, bytes))
                        if *first + (bytes.len() / page.len()) as u64 == index
                            && bytes.len() / page.len() < RUN_PAGES =>
                    {
                        bytes.extend_from_slice(&page)
                    }
                    _ => runs.push((index, page)),
                }
            }
            // The journaled pages stay dirty (their pages on disk are
            // old) but need nothing more until the next checkpoint.
            let mut appended = Vec::new();
            let journal_at = store.pages() + state.journal.next;
            for index in &logged {
                let cached = state.pages.get_mut(index).expect("listed above");
                cached.changed = Vec::new();
                cached.writing = true;
            }
            for chunk in entries.chunks(JOURNAL_PER_PAGE) {
                let page = JournalPage {
                    space: self.space,
                    epoch: state.journal.epoch,
                    position: state.journal.next,
                    entries: chunk.to_vec(),
                };
                state.journal.next += 1;
                appended.extend_from_slice(&page.encode());
            }
            (indices, logged, runs, journal_at, appended, checkpoint)
        };
        if runs.is_empty() && appended.is_empty() && !checkpoint {
            return Ok(());
        }
        let writes = runs
            .into_iter()
            .map(|(first, bytes)| (first, Bytes::from(bytes)))
            .chain((!appended.is_empty()).then(|| (journal_at, Bytes::from(appended))));
        let results: Vec<Result<(), EngineError>> =
            stream::iter(writes.map(|(first, bytes)| store.write_pages(first, bytes)))
                .buffer_unordered(WRITE_BACK_PARALLEL)
                .collect()
                .await;
        let mut failed = results.into_iter().find_map(Result::err);
        // A checkpoint's pages are on disk before the journal they make
        // unnecessary is written over from position 0.
        if failed.is_none() && checkpoint {
            failed = store.flush().await.err();
        }
        {
            let mut state = self.state();
            for index in written.iter().chain(&logged) {
                if let Some(cached) = state.pages.get_mut(index) {
                    cached.writing = false;
                    if failed.is_some() {
                        // Neither the page nor the journal may hold it.
                        cached.dirty = true;
                        cached.whole = true;
                    }
                }
            }
            if failed.is_some() {
                // Whatever reached the journal is superseded by the
                // pages written whole at the next checkpoint.
                state.journal.checkpoint = true;
            } else if checkpoint {
                state.journal.checkpoint = false;
                state.journal.next_epoch();
            }
            let written_now = &written;
            if let (None, Some(written)) = (&failed, state.written.as_mut()) {
                written.extend(written_now.iter().copied());
            }
        }
        match failed {
            None => {
                self.state().trim_at = 0;
                self.trim();
                Ok(())
            }
            Some(error) => Err(error),
        }
    }

    /// Lay the journal's entries over the pages they change (opening a
    /// space's sums): each entry whose page on disk is not newer than the
    /// entry. Those pages are written whole, and flushed, before anything
    /// is journaled again (a checkpoint, [`Journal`]), and the journal
    /// goes on in an epoch past any found. Returns the entries applied.
    pub(crate) async fn recover(&self, store: &dyn SumsStore) -> usize {
        let journal_pages = store.journal_pages();
        let base = store.pages();
        let mut found: Vec<JournalPage> = Vec::new();
        for position in 0..journal_pages {
            let newest = store
                .read_page(base + position)
                .await
                .into_iter()
                .filter_map(Result::ok)
                .filter_map(|bytes| JournalPage::decode(&bytes, self.space, position))
                .max_by_key(|page| page.epoch);
            found.extend(newest);
        }
        found.sort_by_key(|page| (page.epoch, page.position));
        let mut applied = 0;
        for entry in found.iter().flat_map(|page| &page.entries) {
            if entry.block >= base * SUMS_PER_PAGE as u64 {
                continue;
            }
            let (index, slot) = page_of(entry.block);
            self.load(store, index..index + 1).await;
            let mut state = self.state();
            let cached = state.pages.get_mut(&index).expect("loaded above");
            if cached.page.generation <= entry.generation {
                cached.page.sums[slot] = entry.sum;
                cached.dirty = true;
                cached.whole = true;
                cached.changed = Vec::new();
                applied += 1;
            }
        }
        let mut state = self.state();
        let epoch = found.iter().map(|page| page.epoch).max().unwrap_or(0);
        state.journal = Journal::opened(epoch.max(state.journal.epoch) + 1);
        applied
    }

    /// Write every dirty page whole and flush, and journal nothing until
    /// [`Sums::resume`] (the store's layout is about to change: the
    /// journal moves).
    pub(crate) async fn pause(&self, store: &dyn SumsStore) -> Result<(), EngineError> {
        self.state().journal.paused = true;
        self.write_back(store, None).await?;
        store.flush().await
    }

    /// Journal again, from position 0 of a new epoch (see [`Sums::pause`]).
    pub(crate) fn resume(&self) {
        let mut state = self.state();
        state.journal.paused = false;
        state.journal.next_epoch();
    }

    /// Drop clean pages beyond the budget, least recently used first,
    /// down to seven eighths of it: the sort then runs once per eighth of
    /// the budget loaded, not on every load past it. Asked by every
    /// request: while fewer pages are cached than the budget allows,
    /// clean or not, it looks at nothing else.
    fn trim(&self) {
        let mut state = self.state();
        if state.pages.len() <= self.budget_pages.max(state.trim_at) {
            return;
        }
        let idle = |c: &Cached| !c.dirty && !c.writing;
        let clean = state.pages.values().filter(|c| idle(c)).count();
        if clean <= self.budget_pages {
            state.trim_at = state.pages.len() + self.budget_pages / 8;
            return;
        }
        state.trim_at = 0;
        let keep = self.budget_pages - self.budget_pages / 8;
        let mut by_age: Vec<(u64, u64)> = state
            .pages
            .iter()
            .filter(|(_, c)| idle(c))
            .map(|(&index, c)| (c.used, index))
            .collect();
        by_age.sort_unstable();
        for (_, index) in by_age.into_iter().take(clean - keep) {
            state.pages.remove(&index);
        }
    }
}

/// Sums in one page.
#[cfg(test)]
pub(crate) const PER_PAGE: u64 = SUMS_PER_PAGE as u64;

/// Clean pages a space keeps cached: 16 MiB, the sums of 8 GiB.
pub(crate) const BUDGET_PAGES: usize = 4096;

/// Consecutive dirty pages written back as one request: 1 MiB.
const RUN_PAGES: usize = 256;

/// Write-back requests in flight at once.
const WRITE_BACK_PARALLEL: usize = 16;

/// Slots of a page changed between two write-backs past which the page is
/// written whole rather than journaled (24 bytes an entry: 64 are 1.5 KiB
/// of journal against 4 KiB of page).
const PAGE_CHANGES: usize = 64;

/// One space's sums: its cached pages, where they live, and the writes in
/// flight.
///
/// A write's blocks hold old or new bytes on the disks until it is done,
/// and reads take no row lock: so a write names its new sums here
/// ([`SpaceSums::begin`]) before its first byte goes out and sets them in
/// the pages when it is done. A block read meanwhile passes if it matches
/// either; only a block that matches neither is rebuilt.
pub(crate) struct SpaceSums {
    cache: Sums,
    store: std::sync::Arc<dyn SumsStore>,
    inflight: Mutex<Inflight>,
}

#[derive(Default)]
struct Inflight {
    next: u64,
    /// Id, first block, the blocks' new sums (`None`: any content, a range
    /// being zeroed or trimmed).
    writes: Vec<(u64, u64, u64, Option<Vec<u64>>)>,
}

/// A write in flight (see [`SpaceSums`]); dropping it forgets it.
pub(crate) struct InflightGuard<'a> {
    sums: &'a SpaceSums,
    id: u64,
}

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        let mut inflight = self.sums.inflight();
        inflight.writes.retain(|write| write.0 != self.id);
    }
}

impl SpaceSums {
    /// `fresh`: on slabs zeroed just now (see [`Sums::new`]).
    pub(crate) fn new(
        space: SpaceId,
        store: std::sync::Arc<dyn SumsStore>,
        fresh: bool,
    ) -> SpaceSums {
        SpaceSums {
            cache: Sums::new(space, BUDGET_PAGES, fresh),
            store,
            inflight: Mutex::new(Inflight::default()),
        }
    }

    fn inflight(&self) -> MutexGuard<'_, Inflight> {
        self.inflight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The sums of `blocks` (0: not known).
    pub(crate) async fn get(&self, blocks: Range<u64>) -> Vec<u64> {
        self.cache.get(&*self.store, blocks).await
    }

    /// Set the sums of the blocks from `first` on.
    pub(crate) async fn set(&self, first: u64, sums: &[u64]) {
        self.cache.set(&*self.store, first, sums).await
    }

    /// Name a write of `count` blocks from `first` in flight, with its new
    /// sums (`None`: the range is being zeroed or trimmed).
    pub(crate) fn begin(
        &self,
        first: u64,
        count: u64,
        sums: Option<Vec<u64>>,
    ) -> InflightGuard<'_> {
        let mut inflight = self.inflight();
        inflight.next += 1;
        let id = inflight.next;
        inflight.writes.push((id, first, count, sums));
        InflightGuard { sums: self, id }
    }

    /// Whether a write in flight may have left `block` holding content
    /// whose sum is `sum`.
    pub(crate) fn in_flight(&self, block: u64, sum: u64) -> bool {
        self.inflight()
            .writes
            .iter()
            .any(|(_, first, count, sums)| {
                (*first..first + count).contains(&block)
                    && sums
                        .as_ref()
                        .is_none_or(|sums| sums[(block - first) as usize] == sum)
            })
    }

    /// Give the pages of the sums of `blocks` their room (see
    /// [`SumsStore::provide`]): before the first write to an extent of a
    /// thin space.
    pub(crate) async fn provide(&self, blocks: Range<u64>) -> Result<(), EngineError> {
        if blocks.is_empty() {
            return Ok(());
        }
        let per_page = SUMS_PER_PAGE as u64;
        let pages = (blocks.start / per_page)..(blocks.end - 1) / per_page + 1;
        let pages = pages.start.min(self.store.pages())..pages.end.min(self.store.pages());
        self.store.provide(pages).await
    }

    /// Forget the sums of `blocks` (see [`Sums::fill`]).
    pub(crate) async fn forget(&self, blocks: Range<u64>) {
        self.cache
            .fill(&*self.store, blocks, terrace_meta::sums::UNKNOWN)
            .await
    }

    /// Know `blocks` as zeroed (see [`Sums::fill`]).
    pub(crate) async fn zeroed(&self, blocks: Range<u64>) {
        self.cache.fill(&*self.store, blocks, ZEROES).await
    }

    /// Take a blank page of a space created with its sums as its blocks
    /// being zero (see `State::blank_zeroes`).
    pub(crate) fn set_blank_zeroes(&self, zeroes: bool) {
        self.cache.state().blank_zeroes = zeroes;
    }

    /// Make every changed sum durable once the caller flushes: journaled,
    /// or its page written to every copy (see [`Journal`]).
    pub(crate) async fn write_back(&self) -> Result<(), EngineError> {
        self.cache.write_back(&*self.store, None).await
    }

    /// Lay the journal over the pages (see [`Sums::recover`]).
    pub(crate) async fn recover(&self) -> usize {
        self.cache.recover(&*self.store).await
    }

    /// See [`Sums::pause`].
    pub(crate) async fn pause(&self) -> Result<(), EngineError> {
        self.cache.pause(&*self.store).await
    }

    /// See [`Sums::resume`].
    pub(crate) fn resume(&self) {
        self.cache.resume()
    }
}

/// Journaling paused (see [`Sums::pause`]) until this is dropped.
pub(crate) struct Paused<'a>(pub(crate) &'a SpaceSums);

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// Something whose changes must be durable before the disks' caches are
/// flushed for a reason that relies on them (the write intent let go of
/// an extent, a pool closing): a space's sums.
pub(crate) trait WriteBack: Send + Sync {
    fn write_back(&self) -> BoxFuture<'_, Result<(), EngineError>>;
}

impl WriteBack for SpaceSums {
    fn write_back(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(SpaceSums::write_back(self))
    }
}

/// The pool's sums, each written back before the write intent lets go of
/// extents ([`Registry::write_back_all`]).
#[derive(Default)]
pub(crate) struct Registry {
    all: Mutex<Vec<std::sync::Weak<dyn WriteBack>>>,
}

impl Registry {
    pub(crate) fn add(&self, sums: std::sync::Weak<dyn WriteBack>) {
        let mut all = self.all.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|weak| weak.strong_count() > 0);
        all.push(sums);
    }

    /// Write back every space's dirty pages; the first error, after trying
    /// all.
    pub(crate) async fn write_back_all(&self) -> Result<(), EngineError> {
        let all: Vec<std::sync::Arc<dyn WriteBack>> = self
            .all
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let mut first = Ok(());
        for sums in all {
            if let Err(error) = sums.write_back().await {
                if first.is_ok() {
                    first = Err(error);
                }
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use futures::executor::block_on;
    use futures::FutureExt;

    use super::*;

    /// Two copies of every page, in memory; a copy may be damaged or lost.
    #[derive(Default)]
    struct MemoryStore {
        copies: Mutex<HashMap<u64, [Option<Vec<u8>>; 2]>>,
        writes: Mutex<u64>,
        reads: Mutex<u64>,
        /// Pages it has room for; 0: unbounded.
        limit: Mutex<u64>,
        /// Pages of journal after the pages.
        journal: Mutex<u64>,
        flushes: Mutex<u64>,
        fail_writes: Mutex<bool>,
        /// The next write lands only once this is let go.
        held: Mutex<Option<futures::channel::oneshot::Receiver<()>>>,
    }

    impl MemoryStore {
        fn damage(&self, index: u64, copy: usize) {
            let mut copies = self.copies.lock().unwrap();
            if let Some(bytes) = copies.get_mut(&index).and_then(|c| c[copy].as_mut()) {
                bytes[100] ^= 1;
            }
        }
    }

    impl SumsStore for MemoryStore {
        fn read_page(&self, index: u64) -> BoxFuture<'_, Vec<Result<BytesMut, EngineError>>> {
            *self.reads.lock().unwrap() += 1;
            let copies = self.copies.lock().unwrap().get(&index).cloned();
            let read = copies
                .unwrap_or_default()
                .into_iter()
                .map(|copy| Ok(BytesMut::from(&copy.unwrap_or(vec![0; 4096])[..])))
                .collect();
            async move { read }.boxed()
        }

        fn write_pages(&self, first: u64, bytes: Bytes) -> BoxFuture<'_, Result<(), EngineError>> {
            if let Some(held) = self.held.lock().unwrap().take() {
                return async move {
                    let _ = held.await;
                    self.write_pages(first, bytes).await
                }
                .boxed();
            }
            let failing = *self.fail_writes.lock().unwrap();
            if !failing {
                *self.writes.lock().unwrap() += 1;
                for (index, page) in (first..).zip(bytes.chunks(4096)) {
                    let copy = Some(page.to_vec());
                    self.copies
                        .lock()
                        .unwrap()
                        .insert(index, [copy.clone(), copy]);
                }
            }
            async move {
                if failing {
                    Err(EngineError::Closed { pool: "p".into() })
                } else {
                    Ok(())
                }
            }
            .boxed()
        }

        fn pages(&self) -> u64 {
            match *self.limit.lock().unwrap() {
                0 => u64::MAX / 1024,
                limit => limit,
            }
        }

        fn journal_pages(&self) -> u64 {
            *self.journal.lock().unwrap()
        }

        fn provide(&self, _: Range<u64>) -> BoxFuture<'_, Result<(), EngineError>> {
            async { Ok(()) }.boxed()
        }

        fn flush(&self) -> BoxFuture<'_, Result<(), EngineError>> {
            *self.flushes.lock().unwrap() += 1;
            async { Ok(()) }.boxed()
        }
    }

    /// A store of `pages` pages and `journal` pages of journal.
    fn journaled(pages: u64, journal: u64) -> MemoryStore {
        let store = MemoryStore::default();
        *store.limit.lock().unwrap() = pages;
        *store.journal.lock().unwrap() = journal;
        store
    }

    /// Pages of the store's page area written so far.
    fn pages_written(store: &MemoryStore) -> Vec<u64> {
        let mut pages: Vec<u64> = store
            .copies
            .lock()
            .unwrap()
            .keys()
            .copied()
            .filter(|&page| page < store.pages())
            .collect();
        pages.sort_unstable();
        pages
    }

    /// Scattered changes go into the journal, not into their pages, once
    /// the first write-back (a checkpoint) is done; reopened, the sums
    /// read are the journal's.
    #[test]
    fn scattered_changes_are_journaled_and_read_back_after_a_reopen() {
        let store = journaled(64, 8);
        let sums = Sums::new(SPACE, 64, false);
        block_on(sums.set(&store, 3, &[33]));
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(pages_written(&store), vec![0], "the first is a checkpoint");
        assert_eq!(*store.flushes.lock().unwrap(), 1);
        let writes = *store.writes.lock().unwrap();
        for page in 0..40 {
            block_on(sums.set(&store, page * PER_PAGE + page, &[page + 100]));
        }
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(pages_written(&store), vec![0], "no page written whole");
        assert_eq!(
            *store.writes.lock().unwrap(),
            writes + 1,
            "one journal write"
        );
        assert_eq!(sums.dirty_pages(), 40);
        let reopened = Sums::new(SPACE, 64, false);
        assert_eq!(block_on(reopened.recover(&store)), 40);
        for page in 0..40 {
            let block = page * PER_PAGE + page;
            assert_eq!(
                block_on(reopened.get(&store, block..block + 1)),
                vec![page + 100]
            );
        }
        assert_eq!(block_on(reopened.get(&store, 3..4)), vec![33]);
        // Its first write-back writes what it laid over the pages whole.
        block_on(reopened.write_back(&store, None)).unwrap();
        assert_eq!(pages_written(&store).len(), 40);
        assert_eq!(reopened.dirty_pages(), 0);
    }

    /// A journal with no room left makes a checkpoint: every dirty page
    /// written whole and flushed, the journal begun again in a new epoch.
    /// Entries of the old epoch left on disk lose to the pages written
    /// after them, and a page written whole after its entries (too many
    /// changes to journal) wins over them too.
    #[test]
    fn pages_written_whole_win_over_older_journal_entries() {
        let store = journaled(600, 2);
        let sums = Sums::new(SPACE, 1024, false);
        block_on(sums.write_back(&store, None)).unwrap();
        // Block 7 of page 0 journaled as 1, then its page changed in so
        // many slots that it goes whole, with block 7 as 2.
        block_on(sums.set(&store, 7, &[1]));
        block_on(sums.write_back(&store, None)).unwrap();
        let many: Vec<u64> = (0..PAGE_CHANGES as u64 + 1).map(|i| 500 + i).collect();
        block_on(sums.set(&store, 8, &many));
        block_on(sums.set(&store, 7, &[2]));
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(pages_written(&store), vec![0]);
        // Block 9 of page 1 journaled as 3, then more entries than the
        // journal holds: a checkpoint, which writes page 1 whole with 4.
        let flushes = *store.flushes.lock().unwrap();
        block_on(sums.set(&store, PER_PAGE + 9, &[3]));
        block_on(sums.write_back(&store, None)).unwrap();
        block_on(sums.set(&store, PER_PAGE + 9, &[4]));
        for page in 2..600 {
            block_on(sums.set(&store, page * PER_PAGE, &[page]));
        }
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(*store.flushes.lock().unwrap(), flushes + 1);
        assert_eq!(sums.dirty_pages(), 0);
        let reopened = Sums::new(SPACE, 1024, false);
        block_on(reopened.recover(&store));
        assert_eq!(block_on(reopened.get(&store, 7..10)), vec![2, 500, 501]);
        assert_eq!(
            block_on(reopened.get(&store, PER_PAGE + 9..PER_PAGE + 10)),
            vec![4]
        );
        // The new epoch journals again, from its first position.
        block_on(sums.set(&store, 11, &[5]));
        block_on(sums.write_back(&store, None)).unwrap();
        let reopened = Sums::new(SPACE, 1024, false);
        block_on(reopened.recover(&store));
        assert_eq!(
            block_on(reopened.get(&store, 7..12)),
            vec![2, 500, 501, 502, 5]
        );
    }

    /// Past the cache's budget, a write-back writes the least recently
    /// used dirty pages whole (down to seven eighths of the budget) and
    /// journals the rest, with no checkpoint; the cache can then drop the
    /// pages written, and a reopen reads every sum back.
    #[test]
    fn dirty_pages_past_the_budget_go_home_whole_least_recent_first() {
        let store = journaled(64, 8);
        let sums = Sums::new(SPACE, 8, false);
        block_on(sums.write_back(&store, None)).unwrap();
        let flushes = *store.flushes.lock().unwrap();
        for page in 0..12 {
            block_on(sums.set(&store, page * PER_PAGE + 1, &[page + 200]));
        }
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(*store.flushes.lock().unwrap(), flushes, "no checkpoint");
        assert_eq!(
            pages_written(&store),
            (0..5).collect::<Vec<u64>>(),
            "the five least recently used, leaving 7 of 8 dirty"
        );
        assert_eq!(sums.dirty_pages(), 7);
        let reopened = Sums::new(SPACE, 64, false);
        assert_eq!(block_on(reopened.recover(&store)), 7);
        for page in 0..12 {
            let block = page * PER_PAGE + 1;
            assert_eq!(
                block_on(reopened.get(&store, block..block + 1)),
                vec![page + 200]
            );
        }
    }

    /// A failed write-back leaves nothing to the journal: what it held is
    /// written whole at the next, a checkpoint.
    #[test]
    fn after_a_failed_write_back_the_next_is_a_checkpoint() {
        let store = journaled(64, 8);
        let sums = Sums::new(SPACE, 64, false);
        block_on(sums.write_back(&store, None)).unwrap();
        block_on(sums.set(&store, PER_PAGE * 5, &[9]));
        *store.fail_writes.lock().unwrap() = true;
        assert!(block_on(sums.write_back(&store, None)).is_err());
        *store.fail_writes.lock().unwrap() = false;
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(pages_written(&store), vec![5]);
        let reopened = Sums::new(SPACE, 64, false);
        assert_eq!(
            block_on(reopened.get(&store, PER_PAGE * 5..PER_PAGE * 5 + 1)),
            vec![9]
        );
    }

    const SPACE: SpaceId = SpaceId(4);

    /// Blocks past the pages the store has room for (rows of a space's
    /// last extent beyond its end) keep no sums: setting them writes
    /// nothing there.
    #[test]
    fn blocks_past_the_store_keep_no_sums() {
        let store = MemoryStore::default();
        *store.limit.lock().unwrap() = 1;
        let sums = Sums::new(SPACE, 8, false);
        block_on(sums.set(&store, PER_PAGE - 1, &[7, 8, 9]));
        block_on(sums.fill(&store, 0..4 * PER_PAGE, 0));
        block_on(sums.set(&store, PER_PAGE - 1, &[7, 8, 9]));
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(
            block_on(sums.get(&store, PER_PAGE - 1..PER_PAGE + 1)),
            vec![7, 0]
        );
        assert!(store.copies.lock().unwrap().keys().all(|&page| page == 0));
    }

    /// Sums on slabs zeroed just now are read from the store only once
    /// written back (a destage of whole rows reads nothing); sums found
    /// at an import are read.
    #[test]
    fn fresh_sums_read_only_the_pages_written_since() {
        let store = MemoryStore::default();
        let sums = Sums::new(SPACE, 1, true);
        block_on(sums.set(&store, 0, &[5]));
        assert_eq!(block_on(sums.get(&store, 2000..2001)), vec![0]);
        assert_eq!(*store.reads.lock().unwrap(), 0);
        block_on(sums.write_back(&store, None)).unwrap();
        // Budget 1: page 0 is dropped, and read back when wanted.
        assert_eq!(block_on(sums.get(&store, 3000..3001)), vec![0]);
        assert_eq!(block_on(sums.get(&store, 0..1)), vec![5]);
        assert_eq!(*store.reads.lock().unwrap(), 1);
        let opened = Sums::new(SPACE, 1, false);
        assert_eq!(block_on(opened.get(&store, 2000..2001)), vec![0]);
        assert_eq!(*store.reads.lock().unwrap(), 2);
    }

    #[test]
    fn sums_are_unknown_until_set_and_read_back_after_a_reopen() {
        let store = MemoryStore::default();
        let sums = Sums::new(SPACE, 8, false);
        assert_eq!(block_on(sums.get(&store, 500..510)), vec![0; 10]);
        let values: Vec<u64> = (1..=10).collect();
        block_on(sums.set(&store, 500, &values));
        assert_eq!(block_on(sums.get(&store, 500..510)), values);
        assert_eq!(sums.dirty_pages(), 2, "blocks 500..510 span pages 0 and 1");
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(sums.dirty_pages(), 0);
        let reopened = Sums::new(SPACE, 8, false);
        assert_eq!(block_on(reopened.get(&store, 500..510)), values);
        assert_eq!(reopened.refused_pages(), 0);
    }

    #[test]
    fn a_damaged_copy_is_outvoted_and_two_are_unknown_and_counted() {
        let store = MemoryStore::default();
        let sums = Sums::new(SPACE, 8, false);
        block_on(sums.set(&store, 3, &[77]));
        block_on(sums.write_back(&store, None)).unwrap();
        store.damage(0, 0);
        assert_eq!(
            block_on(Sums::new(SPACE, 8, false).get(&store, 3..4)),
            vec![77]
        );
        store.damage(0, 1);
        let lost = Sums::new(SPACE, 8, false);
        assert_eq!(block_on(lost.get(&store, 3..4)), vec![0]);
        assert_eq!(lost.refused_pages(), 1);
    }

    #[test]
    fn write_back_takes_only_the_pages_asked_and_the_newest_generation_wins() {
        let store = MemoryStore::default();
        let sums = Sums::new(SPACE, 8, false);
        block_on(sums.set(&store, 0, &[1]));
        block_on(sums.set(&store, PER_PAGE * 3, &[2]));
        block_on(sums.write_back(&store, Some(0..1))).unwrap();
        assert_eq!(*store.writes.lock().unwrap(), 1);
        assert_eq!(sums.dirty_pages(), 1);
        // A second write of page 0 supersedes the first on any copy.
        let first = store.copies.lock().unwrap()[&0][0].clone();
        block_on(sums.set(&store, 0, &[9]));
        block_on(sums.write_back(&store, None)).unwrap();
        store.copies.lock().unwrap().get_mut(&0).unwrap()[0] = first;
        assert_eq!(
            block_on(Sums::new(SPACE, 8, false).get(&store, 0..1)),
            vec![9]
        );
    }

    #[test]
    fn consecutive_dirty_pages_go_home_as_one_write() {
        let store = MemoryStore::default();
        let sums = Sums::new(SPACE, 8, false);
        for page in [0, 1, 2, 5] {
            block_on(sums.set(&store, page * PER_PAGE + 1, &[page + 10]));
        }
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(*store.writes.lock().unwrap(), 2);
        let reopened = Sums::new(SPACE, 8, false);
        for page in [0, 1, 2, 5] {
            let first = page * PER_PAGE + 1;
            assert_eq!(
                block_on(reopened.get(&store, first..first + 1)),
                vec![page + 10]
            );
        }
    }

    #[test]
    fn a_failed_write_back_leaves_its_pages_dirty() {
        let store = MemoryStore::default();
        let sums = Sums::new(SPACE, 8, false);
        block_on(sums.set(&store, 0, &[5]));
        *store.fail_writes.lock().unwrap() = true;
        assert!(block_on(sums.write_back(&store, None)).is_err());
        assert_eq!(sums.dirty_pages(), 1);
        *store.fail_writes.lock().unwrap() = false;
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(
            block_on(Sums::new(SPACE, 8, false).get(&store, 0..1)),
            vec![5]
        );
    }

    /// A page stays cached while its write-back is under way: dropped as
    /// clean meanwhile and loaded again, it would be what the store held
    /// before (on fresh slabs, blank: zeroes), and reads of the blocks it
    /// covers would fail their sums on every copy. Found by a rebuild
    /// beside a client of a larger space than the cache covers, where
    /// write-backs waited seconds for the disks.
    #[test]
    fn a_page_stays_cached_until_its_write_back_is_done() {
        let store = MemoryStore::default();
        let (release, held) = futures::channel::oneshot::channel();
        *store.held.lock().unwrap() = Some(held);
        let sums = Sums::new(SPACE, 1, true);
        block_on(sums.set(&store, 0, &[5]));
        let mut writing = Box::pin(sums.write_back(&store, None));
        assert!((&mut writing).now_or_never().is_none(), "the write is held");
        for page in 1..4 {
            block_on(sums.get(&store, page * PER_PAGE..page * PER_PAGE + 1));
        }
        assert_eq!(block_on(sums.get(&store, 0..1)), vec![5]);
        release.send(()).unwrap();
        block_on(writing).unwrap();
        for page in 1..4 {
            block_on(sums.get(&store, page * PER_PAGE..page * PER_PAGE + 1));
        }
        assert_eq!(block_on(sums.get(&store, 0..1)), vec![5], "read back");
    }

    #[test]
    fn clean_pages_beyond_the_budget_go_least_recent_first_and_dirty_ones_stay() {
        let store = MemoryStore::default();
        let sums = Sums::new(SPACE, 2, false);
        for page in 0..4 {
            block_on(sums.set(&store, page * PER_PAGE, &[page + 1]));
        }
        assert_eq!(sums.state().pages.len(), 4, "dirty pages stay");
        block_on(sums.write_back(&store, None)).unwrap();
        assert_eq!(sums.state().pages.len(), 2);
        let kept: Vec<u64> = {
            let mut kept: Vec<u64> = sums.state().pages.keys().copied().collect();
            kept.sort();
            kept
        };
        assert_eq!(kept, vec![2, 3], "the most recently used");
        // A dropped page loads again from its store.
        assert_eq!(block_on(sums.get(&store, 0..1)), vec![1]);
    }

    /// Past the budget, clean pages go down to seven eighths of it at
    /// once, so the next loads do not each sort the cache.
    #[test]
    fn past_the_budget_clean_pages_go_down_to_seven_eighths_of_it() {
        let store = MemoryStore::default();
        let sums = Sums::new(SPACE, 16, false);
        for page in 0..16 {
            block_on(sums.get(&store, page * PER_PAGE..page * PER_PAGE + 1));
        }
        assert_eq!(sums.state().pages.len(), 16, "within the budget");
        block_on(sums.get(&store, 16 * PER_PAGE..16 * PER_PAGE + 1));
        assert_eq!(sums.state().pages.len(), 14);
        assert!(
            sums.state().pages.contains_key(&16),
            "the page just used stays"
        );
        block_on(sums.get(&store, 17 * PER_PAGE..17 * PER_PAGE + 1));
        assert_eq!(
            sums.state().pages.len(),
            15,
            "no trim until past the budget"
        );
    }
}
