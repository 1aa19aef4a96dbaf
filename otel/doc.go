// Package idemotel turns idemkit's seams into OpenTelemetry traces and metrics.
package idemotel
