use thiserror::Error;

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Load(#[from] loader::LoadError),
    /// A backend refused or failed an op. `backend` and `op` say where; `msg` is the backend's
    /// own `last_error` text.
    #[error("{backend}: {op}: {msg}")]
    Backend {
        backend: String,
        op: &'static str,
        msg: String,
    },
    /// `file` and `msg` may quote the model file's own bytes: shown through
    /// [`loader::printable`].
    #[error("{}: {}", loader::printable(.file), loader::printable(.msg))]
    Model { file: String, msg: String },
    #[error("context is full: {need} tokens needed, the context holds {n_ctx}")]
    ContextFull { need: usize, n_ctx: usize },
    /// The shared KV pool has no page left for a sequence.
    #[error("the KV cache pool is full: the sequence needs {need} rows and holds {held}, the pool has {total} in all (raise --ctx, or run fewer sequences at once)")]
    KvFull {
        need: usize,
        held: usize,
        total: usize,
    },
    #[error("{}", loader::printable(.0))]
    Invalid(String),
    /// A graph (a package's, or one a builder wrote) refused by the compiler.
    #[error(transparent)]
    Graph(#[from] crate::graph::GraphError),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
