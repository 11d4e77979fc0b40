//! Callbacks used by Storage API

use std::io;

use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::async_runtime::AsyncOneshotSendExt;
use crate::core::notify::Notify;
use crate::raft_state::io_state::log_io_id::LogIOId;
use crate::type_config::alias::OneshotSenderOf;
use crate::LogId;
use crate::RaftTypeConfig;
use crate::StorageIOError;

/// Where a log flush is reported.
enum FlushedTx<C>
where C: RaftTypeConfig
{
    /// To a caller that waits for the flush (a follower's append, or any append the core
    /// awaits before it goes on).
    Oneshot(OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>),
    /// Straight to `RaftCore`, as a notification: a leader's append that the core does not
    /// wait for, so replication to followers runs while the leader's own flush does.
    Core(mpsc::UnboundedSender<Notify<C>>),
}

/// A oneshot callback for completion of log io operation.
pub struct LogFlushed<C>
where C: RaftTypeConfig
{
    log_io_id: LogIOId<C::NodeId>,
    tx: FlushedTx<C>,
}

impl<C> LogFlushed<C>
where C: RaftTypeConfig
{
    pub(crate) fn new(
        log_io_id: LogIOId<C::NodeId>,
        tx: OneshotSenderOf<C, Result<LogIOId<C::NodeId>, io::Error>>,
    ) -> Self {
        Self {
            log_io_id,
            tx: FlushedTx::Oneshot(tx),
        }
    }

    /// A callback that reports to `RaftCore` as [`Notify::LocalLogFlushed`].
    pub(crate) fn to_core(log_io_id: LogIOId<C::NodeId>, tx: mpsc::UnboundedSender<Notify<C>>) -> Self {
        Self {
            log_io_id,
            tx: FlushedTx::Core(tx),
        }
    }

    /// Report log io completion event.
    ///
    /// It will be called when the log is successfully appended to the storage or an error occurs.
    pub fn log_io_completed(self, result: Result<(), io::Error>) {
        if let Err(e) = &result {
            tracing::error!("LogFlush error: {}, while flushing upto {}", e, self.log_io_id);
        }
        let sent = match self.tx {
            FlushedTx::Oneshot(tx) => {
                let res = match result {
                    Err(e) => tx.send(Err(e)),
                    Ok(()) => tx.send(Ok(self.log_io_id.clone())),
                };
                res.is_ok()
            }
            FlushedTx::Core(tx) => tx
                .send(Notify::LocalLogFlushed {
                    log_io_id: self.log_io_id.clone(),
                    result: result.map_err(|e| e.to_string()),
                })
                .is_ok(),
        };
        if !sent {
            tracing::error!("failed to send log io completion event: {}", self.log_io_id);
        }
    }
}

/// A oneshot callback for completion of applying logs to state machine.
pub struct LogApplied<C>
where C: RaftTypeConfig
{
    last_log_id: LogId<C::NodeId>,
    tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
}

impl<C> LogApplied<C>
where C: RaftTypeConfig
{
    #[allow(dead_code)]
    pub(crate) fn new(
        last_log_id: LogId<C::NodeId>,
        tx: oneshot::Sender<Result<(LogId<C::NodeId>, Vec<C::R>), StorageIOError<C::NodeId>>>,
    ) -> Self {
        Self { last_log_id, tx }
    }

    /// Report apply io completion event.
    ///
    /// It will be called when the log is successfully applied to the state machine or an error
    /// occurs.
    pub fn completed(self, result: Result<Vec<C::R>, StorageIOError<C::NodeId>>) {
        let res = match result {
            Ok(x) => {
                tracing::debug!("LogApplied upto {}", self.last_log_id);
                let resp = (self.last_log_id.clone(), x);
                self.tx.send(Ok(resp))
            }
            Err(e) => {
                tracing::error!("LogApplied error: {}, while applying upto {}", e, self.last_log_id);
                self.tx.send(Err(e))
            }
        };

        if let Err(_e) = res {
            tracing::error!("failed to send apply complete event, last_log_id: {}", self.last_log_id);
        }
    }
}
