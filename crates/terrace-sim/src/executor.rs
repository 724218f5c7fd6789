//! A deterministic single-threaded executor.
//!
//! Every choice that a real machine makes by timing — which ready task runs
//! next, which disk operation completes next — is made here by a seeded
//! generator. The same seed therefore replays the same run exactly, and a
//! run can be stopped after any step to simulate a power cut.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

use crate::random::Random;
use crate::world::World;

type Task = Pin<Box<dyn Future<Output = ()>>>;

struct TaskWaker {
    id: usize,
    ready: Arc<Mutex<Vec<usize>>>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        if !ready.contains(&self.id) {
            ready.push(self.id);
        }
    }
}

pub struct Executor {
    tasks: Vec<Option<Task>>,
    ready: Arc<Mutex<Vec<usize>>>,
    random: Rc<RefCell<Random>>,
    world: Arc<World>,
}

/// Why [`Executor::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Every task finished.
    Finished,
    /// The step budget ran out (the caller may cut the power now).
    Budget,
    /// Tasks remain but none can make progress: a deadlock.
    Stuck,
}

impl Executor {
    pub fn new(random: Rc<RefCell<Random>>, world: Arc<World>) -> Executor {
        Executor {
            tasks: Vec::new(),
            ready: Arc::new(Mutex::new(Vec::new())),
            random,
            world,
        }
    }

    pub fn spawn(&mut self, future: impl Future<Output = ()> + 'static) {
        let id = self.tasks.len();
        self.tasks.push(Some(Box::pin(future)));
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(id);
    }

    fn pick_ready(&self) -> Option<usize> {
        let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        if ready.is_empty() {
            return None;
        }
        let index = self.random.borrow_mut().below(ready.len() as u64) as usize;
        Some(ready.swap_remove(index))
    }

    /// Run until every task is done, or `steps` steps have been taken.
    /// A step polls one ready task or completes one disk operation.
    pub fn run(&mut self, steps: u64) -> Stop {
        for _ in 0..steps {
            if self.tasks.iter().all(Option::is_none) {
                return Stop::Finished;
            }
            if let Some(id) = self.pick_ready() {
                self.poll(id);
                continue;
            }
            let completed = {
                let mut random = self.random.borrow_mut();
                self.world.complete_one(&mut random)
            };
            if !completed {
                return Stop::Stuck;
            }
        }
        if self.tasks.iter().all(Option::is_none) {
            Stop::Finished
        } else {
            Stop::Budget
        }
    }

    fn poll(&mut self, id: usize) {
        let Some(task) = self.tasks[id].as_mut() else {
            return;
        };
        let waker = Waker::from(Arc::new(TaskWaker {
            id,
            ready: self.ready.clone(),
        }));
        let mut context = Context::from_waker(&waker);
        if task.as_mut().poll(&mut context).is_ready() {
            self.tasks[id] = None;
        }
    }

    /// Run a single future to completion (setup and checking phases).
    pub fn block_on<T: 'static>(&mut self, future: impl Future<Output = T> + 'static) -> T {
        let slot = Rc::new(RefCell::new(None));
        let output = slot.clone();
        self.spawn(async move {
            *output.borrow_mut() = Some(future.await);
        });
        let stop = self.run(u64::MAX);
        assert_eq!(stop, Stop::Finished, "simulation stuck");
        let value = slot.borrow_mut().take();
        value.expect("finished task left its output")
    }
}
