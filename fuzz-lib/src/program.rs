//! The hostile input the `tracker` and `differential` targets share: a configuration and a
//! bounded sequence of steps (observations, answers to the commands issued, stray answers,
//! ticks, time, state round trips, re-lists, big slices).

use crate::input::{Dec, Enc};
use clb_sandbox::bindings::clb::reconciler::types as wit;

/// The most steps of one program: enough to build up state, few enough that the checks at the
/// end run often.
pub const MAX_STEPS: usize = 200;
/// The most observations of one batch, answers of one step.
pub const MAX_BATCH: u8 = 8;

/// How one issued command is answered.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// What the world does (`tracker`); a plain success (`differential`).
    Truth,
    /// Fails without the change taking effect.
    FailBefore(wit::Failure),
    /// The change takes effect, and the answer is a failure anyway (a lost response).
    FailAfter(wit::Failure),
    /// Exactly this outcome, whatever the command was.
    Literal(wit::Outcome),
}

/// How the host's clock moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Time {
    Forward(u64),
    Back(u64),
    Still,
    Set(u64),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Observe(Vec<wit::Observation>),
    /// Answers to commands in flight, each picked by its index (modulo how many are in flight).
    Answer(Vec<(u8, Answer)>),
    /// Answers to ids that are not in flight (answered already, or never issued).
    Stray(Vec<(u64, wit::Outcome)>),
    Tick,
    Time(Time),
    RoundTrip,
    /// The Kubernetes changes the tracker's own writes caused, delivered (`tracker` only).
    Deliver,
    /// Every object seen so far, again, and `lists-complete`.
    Relist,
    /// A slice with up to [`crate::input::MAX_BIG`] endpoints.
    Big(wit::EndpointSlice),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub config: wit::Config,
    pub steps: Vec<Step>,
}

impl Dec<'_> {
    pub fn answer(&mut self) -> Answer {
        match self.byte() % 6 {
            0..=2 => Answer::Truth,
            3 => Answer::FailBefore(self.failure()),
            4 => Answer::FailAfter(self.failure()),
            _ => Answer::Literal(self.outcome()),
        }
    }

    pub fn time(&mut self) -> Time {
        match self.byte() % 5 {
            0 => Time::Forward(self.u64()),
            1 => Time::Back(self.u64()),
            2 => Time::Still,
            3 => Time::Set(self.u64()),
            _ => Time::Forward(u64::from(self.byte()) * 500),
        }
    }

    pub fn step(&mut self) -> Step {
        match self.byte() % 12 {
            0..=2 => Step::Observe((0..self.len(MAX_BATCH)).map(|_| self.observation()).collect()),
            3 | 4 => Step::Answer((0..self.len(MAX_BATCH)).map(|_| (self.byte(), self.answer())).collect()),
            5 => Step::Stray((0..self.len(3)).map(|_| (self.u64(), self.outcome())).collect()),
            6 => Step::Tick,
            7 => Step::Time(self.time()),
            8 => Step::RoundTrip,
            9 => Step::Deliver,
            10 => Step::Relist,
            _ => Step::Big(self.slice(true)),
        }
    }

    /// A program: the configuration, a step count, then the steps (stopping early when the
    /// input ends).
    pub fn program(&mut self) -> Program {
        let config = self.config();
        let count = usize::from(self.byte()) * MAX_STEPS / 255;
        let mut steps = Vec::new();
        for _ in 0..count {
            if self.is_empty() {
                break;
            }
            steps.push(self.step());
        }
        Program { config, steps }
    }
}

impl Enc {
    pub fn answer(&mut self, a: &Answer) {
        match a {
            Answer::Truth => self.byte(0),
            Answer::FailBefore(f) => {
                self.byte(3);
                self.failure(f);
            }
            Answer::FailAfter(f) => {
                self.byte(4);
                self.failure(f);
            }
            Answer::Literal(o) => {
                self.byte(5);
                self.outcome(o);
            }
        }
    }

    pub fn time(&mut self, t: Time) {
        match t {
            Time::Forward(v) => {
                self.byte(0);
                self.u64(v);
            }
            Time::Back(v) => {
                self.byte(1);
                self.u64(v);
            }
            Time::Still => self.byte(2),
            Time::Set(v) => {
                self.byte(3);
                self.u64(v);
            }
        }
    }

    pub fn step(&mut self, s: &Step) {
        match s {
            Step::Observe(batch) => {
                self.byte(0);
                let n = self.len(batch.len(), MAX_BATCH);
                for o in &batch[..n] {
                    self.observation(o);
                }
            }
            Step::Answer(answers) => {
                self.byte(3);
                let n = self.len(answers.len(), MAX_BATCH);
                for (i, a) in &answers[..n] {
                    self.byte(*i);
                    self.answer(a);
                }
            }
            Step::Stray(answers) => {
                self.byte(5);
                let n = self.len(answers.len(), 3);
                for (id, o) in &answers[..n] {
                    self.u64(*id);
                    self.outcome(o);
                }
            }
            Step::Tick => self.byte(6),
            Step::Time(t) => {
                self.byte(7);
                self.time(*t);
            }
            Step::RoundTrip => self.byte(8),
            Step::Deliver => self.byte(9),
            Step::Relist => self.byte(10),
            Step::Big(_) => self.byte(10), // seeds carry no big slices: a re-list instead
        }
    }

    /// A program; observation batches longer than [`MAX_BATCH`] are split.
    pub fn program(&mut self, p: &Program) {
        let mut steps = Vec::new();
        for step in &p.steps {
            match step {
                Step::Observe(batch) if batch.len() > usize::from(MAX_BATCH) => {
                    steps.extend(batch.chunks(usize::from(MAX_BATCH)).map(|c| Step::Observe(c.to_vec())));
                }
                Step::Answer(answers) if answers.len() > usize::from(MAX_BATCH) => {
                    steps.extend(answers.chunks(usize::from(MAX_BATCH)).map(|c| Step::Answer(c.to_vec())));
                }
                other => steps.push(other.clone()),
            }
        }
        steps.truncate(MAX_STEPS);
        self.config(&p.config);
        // The decoder reads `byte * MAX_STEPS / 255` steps: the smallest byte that reads them all.
        let count = (steps.len() * 255).div_ceil(MAX_STEPS).min(255) as u8;
        self.byte(count);
        for step in &steps {
            self.step(step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_encoded_reads_back_as_itself() {
        for seed in 0..64u8 {
            let data: Vec<u8> =
                (0..3000u32).map(|i| (i as u8).wrapping_mul(seed | 1).wrapping_add(seed ^ 0x5a)).collect();
            let program = Dec::new(&data).program();
            // Big slices are not encoded (a seed is a scenario's run).
            let program = Program {
                config: program.config,
                steps: program.steps.into_iter().filter(|s| !matches!(s, Step::Big(_))).collect(),
            };
            let mut e = Enc::default();
            e.program(&program);
            let back = Dec::new(&e.bytes).program();
            assert_eq!(back, program);
        }
    }
}
