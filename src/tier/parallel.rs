//! One long text on two sessions (`[model.windows] parallel`): a worker that takes a text of two
//! or more windows alone, while another worker is idle, hands the second half of its windows to
//! that worker as a [`Part`] and runs the first half itself; the riskiest window of both halves
//! decides, as it would in one run.
//!
//! Parts travel on their own unbounded channel, which every worker reads before its job queue, so
//! a part never waits behind new requests. The worker that made a part reads that channel too
//! while it waits: if nobody took its part it runs the part itself, so a part is never stranded
//! (not even with one worker alive), and a part it finds of another text it runs and answers.

use super::model::{Classifier, Output};
use super::windows::Encoded;
use crossbeam_channel::{bounded, select, unbounded, Receiver, Sender};
use tokenizers::Encoding;

/// The second half of a text's windows, and where their outputs go (in window order).
pub(crate) struct Part {
    windows: Vec<Encoding>,
    reply: Sender<anyhow::Result<Vec<Output>>>,
}

/// The pool's part channel; every worker holds a clone.
#[derive(Clone)]
pub(crate) struct Parts {
    tx: Sender<Part>,
    pub(crate) rx: Receiver<Part>,
}

impl Parts {
    pub(crate) fn new() -> Parts {
        let (tx, rx) = unbounded();
        Parts { tx, rx }
    }

    /// Classifies one text, the second half of its windows on whichever worker takes the part
    /// (this one if none does). The text needs at least two windows.
    pub(crate) fn classify(&self, classifier: &mut Classifier, text: Encoded) -> anyhow::Result<Output> {
        let Encoded { mut windows, unread, lexical } = text;
        let theirs = windows.split_off(windows.len().div_ceil(2));
        let (reply, answer) = bounded(1);
        // Cannot fail: this worker holds a receiver.
        let _ = self.tx.send(Part { windows: theirs, reply });
        let mut outputs = classifier.run(&windows)?;
        loop {
            select! {
                recv(answer) -> theirs => {
                    outputs.extend(theirs.map_err(|_| anyhow::anyhow!("the worker running the other half stopped"))??);
                    return Ok(classifier.assets().verdict(&outputs, unread, lexical));
                }
                recv(self.rx) -> part => {
                    if let Ok(part) = part {
                        run(classifier, part, || {});
                    }
                }
            }
        }
    }
}

/// Runs a part and answers it (a caller that gave up is not an error); `done` runs between the
/// two, so that a worker counts as idle again before the text's owner hears back.
pub(crate) fn run(classifier: &mut Classifier, part: Part, done: impl FnOnce()) {
    let outputs = classifier.run(&part.windows);
    done();
    let _ = part.reply.send(outputs);
}
