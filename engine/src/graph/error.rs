//! Why a graph is refused: where (the file, the node) and what. A package's graph is input
//! from a file, so names and messages are shown through [`printable`].

use loader::printable;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("{}: graph is not valid JSON: {source}", printable(.file))]
    Json {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: graph version {found}, this mollm runs version {runs}", printable(.file))]
    Version { file: String, found: u64, runs: u32 },
    #[error("{}: graph has no numeric 'version'", printable(.file))]
    NoVersion { file: String },
    #[error("{}: bad graph: {source}", printable(.file))]
    Schema {
        file: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: graph of {nodes} nodes / {kv_layers} kv layers (limits {max_nodes} / {max_kv_layers})", printable(.file))]
    TooLarge {
        file: String,
        nodes: usize,
        kv_layers: usize,
        max_nodes: usize,
        max_kv_layers: usize,
    },
    #[error("{}: graph kv layer {layer}: implausible geometry {geometry:?}", printable(.file))]
    KvGeometry {
        file: String,
        layer: usize,
        geometry: [i64; 2],
    },
    #[error("{}: graph state {state}: {values} values (must be 1 to {max})", printable(.file))]
    StateSize {
        file: String,
        state: usize,
        values: i64,
        max: i64,
    },
    #[error("{}: graph node {index}: bad name '{}'", printable(.file), .name.escape_debug())]
    NodeName {
        file: String,
        index: usize,
        name: String,
    },
    #[error("{}: graph output '{}' is not a node", printable(.file), printable(.name))]
    NoOutput { file: String, name: String },
    #[error("{}: graph node '{}': {error}", printable(.file), printable(.node))]
    Node {
        file: String,
        node: String,
        #[source]
        error: NodeError,
    },
}

/// What is wrong with one node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Attr(#[from] AttrError),
    #[error("shape dimension {dim}: {source}")]
    Dim {
        dim: usize,
        #[source]
        source: DimError,
    },
    /// A check on the node's inputs, shapes or op; the message says which.
    #[error("{}", printable(.0))]
    Check(String),
}

impl From<String> for NodeError {
    fn from(msg: String) -> NodeError {
        NodeError::Check(msg)
    }
}

impl From<&str> for NodeError {
    fn from(msg: &str) -> NodeError {
        NodeError::Check(msg.into())
    }
}

/// A node attribute that is missing or out of its range.
#[derive(Debug, thiserror::Error)]
pub enum AttrError {
    #[error("{op} has no attribute '{}' (it has: {has})", printable(.attr))]
    Unknown {
        op: &'static str,
        attr: String,
        has: String,
    },
    #[error("missing attribute '{attr}'")]
    Missing { attr: &'static str },
    #[error("attribute '{}' is not a finite number", printable(.attr))]
    NotFinite { attr: String },
    #[error("attribute '{}' must be an integer, got {value}", printable(.attr))]
    NotInteger { attr: String, value: f64 },
    #[error("attribute '{attr}' must be an integer in 0..={max}, got {value}")]
    OutOfRange {
        attr: &'static str,
        max: u64,
        value: f64,
    },
}

/// A dimension expression that does not parse into a linear form in T and O.
#[derive(Debug, thiserror::Error)]
pub enum DimError {
    #[error("dimension expression of {0} bytes (limit 256)")]
    TooLong(usize),
    #[error("'{}': empty term", printable(.0))]
    EmptyTerm(String),
    #[error("'{}': unknown name '{}' (not T, O or a constant)", printable(.expr), printable(.name))]
    UnknownName { expr: String, name: String },
    #[error("'{}': not linear in T and O, or overflows", printable(.0))]
    NotLinear(String),
    #[error("'{}': overflows", printable(.0))]
    Overflow(String),
    #[error("'{}': negative coefficient", printable(.0))]
    Negative(String),
}
