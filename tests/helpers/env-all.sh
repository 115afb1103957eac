#!/bin/bash
# Prints the job's whole environment, one variable a line.
env
