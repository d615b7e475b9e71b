//! Constrained decoding: a sequence may carry a [`TokenConstraint`] (a JSON schema, a grammar)
//! that says, before each pick, which tokens may come next. The scheduler masks the others out
//! of that sequence's row only, so the other sequences of a batched step pick exactly what they
//! pick alone.

/// Why a constraint cannot go on (its matcher's own words); the sequence ends with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ConstraintError(pub String);

/// The language a sequence's output must stay in, token by token.
pub trait TokenConstraint: Send {
    /// Sets every entry of `logits` (one row, the model's vocabulary) whose token may not come
    /// next to negative infinity. An error ends the sequence with it.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError>;
    /// Works out the next mask ahead of [`TokenConstraint::mask`], which then only applies it:
    /// the scheduler calls this beside the step's forward pass. Optional (the default does
    /// nothing); an error here is left for `mask` to report.
    fn prepare(&mut self) {}
    /// The token picked from the masked row.
    fn accept(&mut self, token: u32) -> Result<(), ConstraintError>;
    /// The output is complete and nothing may follow: the sequence stops ("stop").
    fn finished(&self) -> bool;
}

/// Boxed, as a request carries it.
pub type Constraint = Box<dyn TokenConstraint>;
