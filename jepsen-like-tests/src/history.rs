//! Placeholder with the agreed history types; replaced by the checker's history module.

#![allow(missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    pub id: u64,
    pub client: u32,
    pub node: Option<u64>,
    pub key: String,
    pub call_ns: u64,
    pub return_ns: Option<u64>,
    pub input: Input,
    pub output: Output,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Input {
    Claim { owner: String, fingerprint: u8, allow_takeover: bool, lease_ms: u64 },
    Complete { token: u64, value: String },
    Fail { token: u64, retryable: bool, value: Option<String> },
    Extend { token: u64, lease_ms: u64 },
    Takeover { owner: String, force: bool },
    Get,
    Wait,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Output {
    Unknown,
    Refused { reason: String },
    Acquired { token: u64, attempt: u32, takeover: bool },
    Replay { token: u64, value: String },
    InProgress,
    Mismatch,
    StaleToken { current: u64 },
    NotFound,
    WrongState { state: State },
    Completed { token: u64 },
    Failed { token: u64, retryable: bool },
    LeaseExtended { token: u64 },
    Record { view: Option<View> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    InProgress,
    Completed,
    Failed,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    pub state: State,
    pub token: u64,
    pub owner: String,
    pub value: Option<String>,
}

pub type OpId = u64;

#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Mutex<(Vec<Op>, Instant)>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new()
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder { inner: Arc::new(Mutex::new((Vec::new(), Instant::now()))) }
    }
    pub fn invoke(&self, client: u32, node: Option<u64>, key: &str, input: Input) -> OpId {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let id = g.0.len() as u64;
        let call_ns = g.1.elapsed().as_nanos() as u64;
        g.0.push(Op { id, client, node, key: key.into(), call_ns, return_ns: None, input, output: Output::Unknown });
        id
    }
    pub fn ok(&self, id: OpId, output: Output) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let now = g.1.elapsed().as_nanos() as u64;
        if let Some(op) = g.0.get_mut(id as usize) {
            op.return_ns = Some(now);
            op.output = output;
        }
    }
    pub fn unknown(&self, _id: OpId) {}
    pub fn finish(&self) -> Vec<Op> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).0.clone()
    }
}

pub fn write_jsonl(ops: &[Op], mut w: impl std::io::Write) -> Result<(), String> {
    for op in ops {
        serde_json::to_writer(&mut w, op).map_err(|e| e.to_string())?;
        w.write_all(b"\n").map_err(|e| e.to_string())?;
    }
    Ok(())
}
