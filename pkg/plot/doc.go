// Package plot draws the charts of the load generator and the planner as PNG with the standard
// image packages, an anti-aliased rasterizer and a fixed 7×13 bitmap font
// (ASCII; other characters are spelled in ASCII or shown as '?'): line
// charts with one or more series, linear axes with round tick values, a
// legend, horizontal and vertical reference lines and footer lines for
// data attribution. Charts are values; rendering does not modify them and
// is safe for concurrent use.
package plot
