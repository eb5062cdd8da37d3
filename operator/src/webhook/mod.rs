//! webhook
