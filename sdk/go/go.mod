module sluice.dev/nf

go 1.24
